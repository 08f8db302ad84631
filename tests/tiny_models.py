"""Tiny target/draft pairs built from configs (nothing downloads). One helper for every test."""

from __future__ import annotations

import copy
import os

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

VOCAB_SIZE = 64
EOS_TOKEN_ID = 1
PAD_TOKEN_ID = 0
ARCHITECTURES = ("llama", "qwen3", "gemma3")
#: where the tiny models and their inputs live: ``DIVERSED_TEST_DEVICE`` (default ``cpu``; e.g. ``cuda``), checked
#: by conftest.py. The device-agnostic tests (tests/test_trees.py) build everything there.
DEVICE = torch.device(os.environ.get("DIVERSED_TEST_DEVICE", "cpu"))


def _config(architecture: str, hidden_size: int, num_layers: int, vocab_size: int):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=EOS_TOKEN_ID,
        bos_token_id=2,
        pad_token_id=PAD_TOKEN_ID,
        tie_word_embeddings=False,
    )
    if architecture == "llama":
        return LlamaForCausalLM, LlamaConfig(**common)
    if architecture == "qwen3":
        return Qwen3ForCausalLM, Qwen3Config(head_dim=hidden_size // 4, **common)
    if architecture == "gemma3":
        # A short sliding window so tests cross it; every other layer slides.
        return Gemma3ForCausalLM, Gemma3TextConfig(
            head_dim=hidden_size // 4,
            sliding_window=6,
            layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)],
            **common,
        )
    raise ValueError(f"unknown architecture {architecture!r}; choose from {ARCHITECTURES}")


def make_model(
    architecture: str = "llama", hidden_size: int = 32, num_layers: int = 2, vocab_size: int = VOCAB_SIZE, seed: int = 0
):
    model_class, config = _config(architecture, hidden_size, num_layers, vocab_size)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    # Sharpen the output layer a little so distributions are not nearly uniform.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
        # EOS scores 0: rarely chosen, so generations run their full length unless a test sets eos_token_id.
        model.get_output_embeddings().weight[EOS_TOKEN_ID] = 0.0
    model.generation_config.pad_token_id = PAD_TOKEN_ID
    model.generation_config.eos_token_id = EOS_TOKEN_ID
    return model.to(DEVICE)


def make_pair(architecture: str = "llama", noise: float = 0.1, seed: int = 1):
    """(target, draft): the draft is the target with every weight perturbed by ``noise`` standard deviations,
    so the two agree on some tokens and not others (acceptance strictly between 0 and 1)."""
    target = make_model(architecture, hidden_size=32, num_layers=2, seed=seed)
    draft = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for parameter in draft.parameters():
            if parameter.numel() > 1:
                scale = parameter.std() if parameter.std() > 0 else parameter.abs().mean()
                parameter.add_(noise * scale * torch.randn(parameter.shape, generator=generator))
    return target, draft


def prompt(length: int = 5, batch: int = 1, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB_SIZE, (batch, length), generator=generator).to(DEVICE)


def tv_bound(expected: torch.Tensor, num_samples: int, delta: float = 1e-6) -> float:
    """Bound on TV(empirical, expected) that an exact sampler exceeds with probability below ``delta``.

    E[TV] <= 1/2 sum_x sqrt(pi(x)(1 - pi(x)) / n) (Jensen), and TV moves by at most 1/n per sample,
    so by McDiarmid P(TV > E[TV] + eps) <= exp(-2 n eps^2): eps = sqrt(ln(1/delta) / (2n)).
    """
    import math

    expected = expected.detach().double()
    mean_bound = 0.5 * float((expected * (1 - expected) / num_samples).sqrt().sum())
    return mean_bound + math.sqrt(math.log(1 / delta) / (2 * num_samples))


def empirical(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return torch.bincount(tokens.flatten(), minlength=vocab_size).double() / tokens.numel()


def left_padded_batch(lengths, seed=0):
    """Rows of these lengths as ``prompt`` makes them, and the left-padded batch: ``(rows, input_ids, attention_mask)``."""
    rows = [prompt(length, seed=seed + i)[0] for i, length in enumerate(lengths)]
    width = max(lengths)
    input_ids = torch.full((len(rows), width), PAD_TOKEN_ID, device=DEVICE)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long, device=DEVICE)
    for i, row in enumerate(rows):
        input_ids[i, width - len(row) :] = row
        attention_mask[i, width - len(row) :] = 1
    return rows, input_ids, attention_mask


def make_other_model(architecture: str, hidden_size: int = 32, vocab_size: int = VOCAB_SIZE):
    """A tiny causal LM without the Llama layout (GPT-2 or OPT): what an EagleDraft refuses."""
    from transformers import GPT2Config, GPT2LMHeadModel, OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    if architecture == "gpt2":
        config = GPT2Config(
            n_embd=hidden_size, n_layer=1, n_head=4, vocab_size=vocab_size, bos_token_id=2, eos_token_id=1
        )
        return GPT2LMHeadModel(config).eval()
    if architecture == "opt":
        config = OPTConfig(
            hidden_size=hidden_size,
            ffn_dim=2 * hidden_size,
            num_hidden_layers=1,
            num_attention_heads=4,
            vocab_size=vocab_size,
            word_embed_proj_dim=hidden_size,
            pad_token_id=PAD_TOKEN_ID,
            bos_token_id=2,
            eos_token_id=EOS_TOKEN_ID,
        )
        return OPTForCausalLM(config).eval()
    raise ValueError(f"unknown architecture {architecture!r}; choose from ('gpt2', 'opt')")


def make_mtp_model(directory, hidden_size: int = 32, num_layers: int = 2, seed: int = 0):
    """A tiny Mellum checkpoint with one multi-token-prediction layer (a sliding-window layer, as Mellum ships it),
    saved to ``directory`` and loaded from there: ``use_mtp=True`` loads the MTP weights from the target's own
    checkpoint, as for DeepSeek-V3 or GLM-4-MoE. The MTP weights are stored under ``mtp.`` as Mellum stores them."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, MellumConfig, MellumForCausalLM
    from transformers.modeling_layers import MtpModel

    config = MellumConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        sliding_window=6,  # short, so tests cross it
        layer_types=["sliding_attention", "full_attention"] * (num_layers // 2),
        mlp_layer_types=["dense"] * num_layers,
        num_mtp_layers=1,
        mtp_layer_types=["sliding_attention"],
        mtp_mlp_layer_types=["dense"],
        max_position_embeddings=512,
        eos_token_id=EOS_TOKEN_ID,
        bos_token_id=2,
        pad_token_id=PAD_TOKEN_ID,
    )
    torch.manual_seed(seed)
    model = MellumForCausalLM(config).eval()
    with torch.no_grad():  # as make_model: a sharper head, EOS rarely chosen
        model.get_output_embeddings().weight.mul_(8.0)
        model.get_output_embeddings().weight[EOS_TOKEN_ID] = 0.0
    model.generation_config.pad_token_id = PAD_TOKEN_ID
    model.generation_config.eos_token_id = EOS_TOKEN_ID
    model.save_pretrained(directory)
    mtp = MtpModel(model, 1)
    weights = load_file(f"{directory}/model.safetensors")
    weights.update(
        {
            f"mtp.{name}": value.detach().contiguous()
            for name, value in mtp.state_dict().items()
            if not name.startswith(("embed_tokens.", "shared_head.", "rotary_emb."))
        }
    )
    save_file(weights, f"{directory}/model.safetensors", metadata={"format": "pt"})
    return AutoModelForCausalLM.from_pretrained(directory).eval()


def make_gemma4_pair(hidden_size: int = 32, seed: int = 0):
    """(target, assistant): a tiny Gemma 4 text model (per-layer inputs, sliding and full layers) and a Gemma 4
    assistant that cross-attends to its keys and values (transformers' ``SinglePositionMultiTokenCandidateGenerator``
    pairing), drafting three tokens a round."""
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM, Gemma4TextConfig

    common = dict(
        vocab_size=VOCAB_SIZE,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        global_head_dim=8,
        sliding_window=6,  # short, so tests cross it
        max_position_embeddings=512,
        pad_token_id=PAD_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        bos_token_id=2,
    )
    target_config = Gemma4TextConfig(
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention"] * 2,
        vocab_size_per_layer_input=VOCAB_SIZE,
        hidden_size_per_layer_input=8,
        **common,
    )
    assistant_text = Gemma4TextConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        num_kv_shared_layers=2,  # every layer reads the target's keys and values
        vocab_size_per_layer_input=0,
        hidden_size_per_layer_input=0,
        **common,
    )
    torch.manual_seed(seed)
    target = Gemma4ForCausalLM(target_config).eval()
    assistant = Gemma4AssistantForCausalLM(
        Gemma4AssistantConfig(text_config=assistant_text, backbone_hidden_size=hidden_size)
    ).eval()
    with torch.no_grad():  # as make_model: a sharper head, EOS rarely chosen
        for model in (target, assistant):
            model.get_output_embeddings().weight.mul_(4.0)
            model.get_output_embeddings().weight[EOS_TOKEN_ID] = 0.0
            model.generation_config.pad_token_id = PAD_TOKEN_ID
            model.generation_config.eos_token_id = EOS_TOKEN_ID
    assistant.generation_config.num_assistant_tokens = 3
    return target, assistant


def make_dflash_draft(target, block_size: int = 4, seed: int = 0):
    """A tiny DFlash block draft (transformers' ``MuseGlimmerAssistantModel``) for a ``make_model`` target: it reads
    the target's layers 1 and 3 and drafts ``block_size - 1`` tokens a pass."""
    from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    config = MuseGlimmerAssistantConfig(
        hidden_size=target.config.hidden_size,
        intermediate_size=2 * target.config.hidden_size,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=target.config.hidden_size // 4,
        layer_types=["full_attention"],
        block_size=block_size,
        mask_token_id=VOCAB_SIZE - 1,
        target_layer_ids=[1, 3],
        max_position_embeddings=512,
        bos_token_id=2,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
    )
    torch.manual_seed(seed)
    return MuseGlimmerAssistantModel(config).eval()


def accepted_drafts(target, input_ids: torch.Tensor, verifier, **drafter) -> int:
    """Drafts accepted over a sampled run of ``input_ids`` (12 new tokens, seed 1) with ``verifier`` and the drafter
    ``drafter`` asks for: what the relaxed-versus-lossless tests compare on the same seeds."""
    out = target.generate(
        input_ids,
        verifier=verifier,
        do_sample=True,
        max_new_tokens=12,
        generator=torch.Generator().manual_seed(1),
        return_dict_in_generate=True,
        **drafter,
    )
    return int(out.speculation.num_accepted.sum())


def declared_first_token(target, draft, verifier, input_ids: torch.Tensor, sampling: dict):
    """``(pi_1, p_1)`` (each ``(V,)``): the distribution ``verifier`` declares for the first emitted token after
    ``input_ids`` (one row), built from the processed ``q`` and ``p`` of ``sampling``'s processors, the models' last
    hidden states and their untempered distributions; and the processed target distribution itself."""
    from transformers import GenerationConfig

    processors = target._get_logits_processor(GenerationConfig(**sampling))
    with torch.no_grad():
        target_out = target(input_ids, output_hidden_states=True)
        draft_out = draft(input_ids, output_hidden_states=True)
    target_probs = processors(input_ids, target_out.logits[:, -1]).softmax(-1)[:, None]  # (1, 1, V)
    draft_probs = processors(input_ids, draft_out.logits[:, -1]).softmax(-1)[:, None]
    declared, _ = verifier.verification_probs(
        draft_probs,
        target_probs,
        draft_hidden=draft_out.hidden_states[-1][:, -1:],
        target_hidden=target_out.hidden_states[-1][:, -1:],
        untempered_draft_probs=draft_out.logits[:, -1:].softmax(-1),
        untempered_target_probs=target_out.logits[:, -1:].softmax(-1),
    )
    return declared[0, 0], target_probs[0, 0]
