"""Model level: archs, per-type flags, parity with stock fairseq, beam search."""

import pytest
import torch
from fairseq import options
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

from fairseq_plugins.attention import FunctionalMultiheadAttention, attention_fn_names
from helpers import build, toy_batch, toy_task

SOFTMAX = dict(encoder_attention_fn="softmax", decoder_attention_fn="softmax",
               cross_attention_fn="softmax")


def fns(model):
    enc = {l.self_attn.attn_fn.name for l in model.encoder.layers}
    dec = {l.self_attn.attn_fn.name for l in model.decoder.layers}
    cross = {l.encoder_attn.attn_fn.name for l in model.decoder.layers}
    return enc, dec, cross


def test_arch_presets():
    big, _ = build("rela_transformer", encoder_embed_dim=None, decoder_embed_dim=None,
                   encoder_ffn_embed_dim=None, decoder_ffn_embed_dim=None, encoder_layers=None,
                   decoder_layers=None, encoder_attention_heads=None, decoder_attention_heads=None)
    assert fns(big) == ({"rela_g"}, {"rela_g"}, {"rela_g"})
    assert len(big.encoder.layers) == 6 and big.encoder.layers[0].self_attn.num_heads == 8
    assert big.encoder.layers[0].self_attn.embed_dim == 512
    assert big.encoder.layers[0].fc1.out_features == 2048
    assert all(isinstance(l.self_attn, FunctionalMultiheadAttention) for l in big.encoder.layers)


def test_rows_11_to_13_one_attention_type_only():
    for kind, want in (("encoder", ({"rela_g"}, {"softmax"}, {"softmax"})),
                       ("decoder", ({"softmax"}, {"rela_g"}, {"softmax"})),
                       ("cross", ({"softmax"}, {"softmax"}, {"rela_g"}))):
        kw = dict(SOFTMAX)
        kw[f"{kind}_attention_fn"] = "rela_g"
        model, _ = build("rela_transformer_small", **kw)
        assert fns(model) == want


def _pair():
    torch.manual_seed(0)
    stock, task = build("stock_transformer_small")
    torch.manual_seed(0)
    ours, _ = build("rela_transformer_small", task=task, **SOFTMAX)
    return stock, ours, task


def test_softmax_model_equals_stock_transformer():
    stock, ours, task = _pair()
    sd_s, sd_o = stock.state_dict(), ours.state_dict()
    assert list(sd_s) == list(sd_o)  # same parameter names, same order
    # same seed -> same initialisation (the functions add no parameters and no RNG draws)
    assert all(torch.equal(sd_s[k], sd_o[k]) for k in sd_s)
    src, lens, prev = toy_batch(task)
    for mode in ("eval", "train"):
        getattr(stock, mode)(), getattr(ours, mode)()
        a, _ = stock(src, lens, prev)
        b, _ = ours(src, lens, prev)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # loading a stock state dict into ours (and back) is exact: a stock model of another seed
    # takes ours's parameters (strict: no missing or unexpected key) and then computes the same
    torch.manual_seed(1)
    ours2, _ = build("rela_transformer_small", task=task, **SOFTMAX)
    assert not all(torch.equal(sd_s[k], v) for k, v in ours2.state_dict().items())  # really another init
    ours2.load_state_dict(sd_s)
    torch.manual_seed(2)
    back, _ = build("stock_transformer_small", task=task)
    assert not all(torch.equal(sd_o[k], v) for k, v in back.state_dict().items())
    back.load_state_dict(ours2.state_dict())
    sd_b = back.state_dict()
    assert list(sd_b) == list(sd_s) and all(torch.equal(sd_b[k], sd_s[k]) for k in sd_s)
    for m in (stock, ours2, back):
        m.eval()
    a, _ = stock(src, lens, prev)
    for m in (ours2, back):
        b, _ = m(src, lens, prev)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def _generate(model, task, src, lens, beam=4):
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_b=12)
    return gen.forward({"net_input": {"src_tokens": src, "src_lengths": lens}})


def test_beam_search_parity_with_stock():
    stock, ours, task = _pair()
    for m in (stock, ours):
        for p in m.parameters():  # sharpen the model so beams differ
            p.data.mul_(3.0)
        m.eval()
    ours.load_state_dict(stock.state_dict())
    src, lens, _ = toy_batch(task, bsz=4, seed=3)
    hs, ho = _generate(stock, task, src, lens), _generate(ours, task, src, lens)
    for a, b in zip(hs, ho):
        for x, y in zip(a, b):
            assert torch.equal(x["tokens"], y["tokens"])
            torch.testing.assert_close(x["positional_scores"], y["positional_scores"],
                                       rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", attention_fn_names())
def test_beam_search_scores_equal_teacher_forcing(name):
    """Incremental beam search (cache, reordering, beam-size trick) scores every hypothesis as a
    full teacher-forced forward pass does."""
    torch.manual_seed(0)
    model, task = build("rela_transformer_small", encoder_attention_fn=name,
                        decoder_attention_fn=name, cross_attention_fn=name)
    model.eval()
    d = task.target_dictionary
    src, lens, _ = toy_batch(task, bsz=3, seed=5)
    hyps = _generate(model, task, src, lens, beam=3)
    for i, beams in enumerate(hyps):
        for h in beams:
            toks = h["tokens"].unsqueeze(0)
            prev = torch.cat([toks.new_tensor([[d.eos()]]), toks[:, :-1]], dim=1)
            n = int(lens[i])
            logits, _ = model(src[i : i + 1, -n:], lens[i : i + 1], prev)
            lp = model.get_normalized_probs((logits, None), log_probs=True)
            ref = lp[0].gather(-1, toks[0].unsqueeze(-1)).squeeze(-1)
            torch.testing.assert_close(h["positional_scores"], ref, rtol=1e-4, atol=1e-4)


def _parse(arch, *extra):
    parser = options.get_training_parser()
    argv = ["/nonexistent", "--arch", arch, "--task", "translation", "--user-dir",
            "fairseq_plugins", *extra]
    return options.parse_args_and_arch(parser, argv)


def test_cli_rejects_unknown_function_with_choices(capsys):
    with pytest.raises(SystemExit):
        _parse("rela_transformer_small", "--cross-attention-fn", "relux")
    err = capsys.readouterr().err
    assert "relux" in err and "rela_g" in err and "sparsemax" in err


def test_cli_flags_reach_the_model():
    args = _parse("rela_transformer_small", "--encoder-attention-fn", "entmax15", "--cross-attention-fn", "sparsemax",
                  "--encoder-layers", "1", "--decoder-layers", "3", "--encoder-embed-dim", "16",
                  "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "24", "--decoder-ffn-embed-dim", "40",
                  "--encoder-attention-heads", "4", "--decoder-attention-heads", "2", "--share-all-embeddings")
    assert args.encoder_attention_fn == "entmax15"
    assert args.decoder_attention_fn == "rela_g"  # arch default
    # the model is built from the parsed namespace itself (as fairseq-train does)
    model = ARCH_MODEL_REGISTRY["rela_transformer_small"].build_model(args, toy_task())
    assert fns(model) == ({"entmax15"}, {"rela_g"}, {"sparsemax"})
    assert len(model.encoder.layers) == 1 and len(model.decoder.layers) == 3
    enc, dec = model.encoder.layers[0], model.decoder.layers[0]
    assert enc.self_attn.embed_dim == 16 and enc.self_attn.num_heads == 4 and enc.fc1.out_features == 24
    assert dec.self_attn.num_heads == 2 and dec.encoder_attn.num_heads == 2 and dec.fc1.out_features == 40
    assert model.encoder.embed_tokens is model.decoder.embed_tokens  # --share-all-embeddings


def test_build_model_rejects_unknown_function_in_python():
    with pytest.raises(ValueError, match="valid choices"):
        build("rela_transformer_small", decoder_attention_fn="nope")
