"""Criterions (cross-entropy plus auxiliary terms reported by modules) -- see issue 3."""
