"""``EagleDraft``: an EAGLE-style feature draft (Li et al., 2024) for a causal LM, as a transformers model.

It supports the decoder architectures :data:`LAYOUTS` names (Llama, Mistral, Qwen2/3, Gemma 3, Phi-3, GPT-NeoX), each
tested for greedy parity; another is refused with a ``ValueError`` naming it and the entry to add.

The draft reads the target's own features. At column ``j`` of a sequence it takes the target's last hidden state at
column ``j - 1`` (``h_{j-1}``: after the final norm, what the target's LM head reads; zeros at the first token) and
the embedding of token ``j``, maps their concatenation to the hidden size (``fc``), runs ``num_layers`` decoder layers
of the **target's own architecture** (built from its config: attention, rotary embedding, sliding windows as the target
has them; no norm before the first layer or after the last, as EAGLE's; no bias in ``fc``), and so predicts the
feature ``f_j ~ h_j``. The target's LM head on ``f_j`` scores the token
at ``j + 1``. While drafting, later columns read the draft's own predicted features instead of the target's
(:class:`~diversed_hf.drafting.feature_candidates.FeatureCandidateGenerator`; ``docs/eagle.md``).

What is the target's and what is the draft's:

- the token embeddings and the LM head are the target's, frozen and **not saved** with the draft: they are attached
  by :meth:`EagleDraft.attach_target` (``generate`` attaches the target it runs with; :meth:`EagleDraft.for_target`
  at construction);
- the LM head may be restricted to a subset of ids (``draft_vocab_ids``, FR-Spec-style pruning: the most frequent ids
  of the training data), saved with the draft; the draft's logits are ``-inf`` outside it, so ``q`` gives those ids
  probability 0 and lossless verification stays exact;
- ``fc``, the decoder layers and the final norm are the draft's trained weights (``model.safetensors``).

Saved in the Hub format (``config.json`` with ``model_type: "diversed_eagle"`` and the target's config,
``model.safetensors``, ``generation_config.json``, a card ``README.md``); ``AutoConfig`` / ``AutoModel`` know the type
once :mod:`diversed_hf` is imported. :meth:`EagleDraft.save_for_vllm` writes the layout vLLM's ``eagle`` method loads
instead (:mod:`diversed_hf.drafting.eagle_export`).
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, GenerationConfig, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.utils import ModelOutput

from .. import compat
from .eagle3 import Eagle3Layer, check_aux_layer_ids
from .protocol import register_drafter

__all__ = ["EagleDraft", "EagleDraftConfig", "EagleDraftOutput"]

#: what an EagleDraft's layers are (EagleDraftConfig.architecture)
ARCHITECTURES = ("eagle", "eagle3")


class EagleDraftConfig(PretrainedConfig):
    """Configuration of an :class:`EagleDraft`.

    Args:
        target_config: the target's (text) config as a dict (``config.to_dict()``): the draft's layers follow it.
        num_layers: decoder layers of the draft (EAGLE uses 1).
        draft_vocab_size: size of the id subset the draft scores; ``None``: the target's whole vocabulary.
        target_model_id: the Hub id or path of the target the draft was trained for (informational, as in cards).
        fc_bias, input_norm, final_norm: a bias in ``fc``; the first layer's input norm; a norm after the last layer.
            All off by default. EAGLE's reference code also has no norm before its first layer and none after its
            last (``fc`` already sees the target's normed feature, and the output is regressed onto it), but its
            ``fc`` has a bias by default; ours does not (``fc_bias=True`` gives it one). ``save_pretrained`` writes
            this project's layout (``model_type: diversed_eagle``); :meth:`EagleDraft.save_for_vllm` writes the one
            vLLM's ``eagle`` method loads (Llama targets).
        architecture: ``"eagle"`` (EAGLE-1 style, the module docstring) or ``"eagle3"``
            (:mod:`diversed_hf.drafting.eagle3`: ``fc`` over the target's layers ``aux_layer_ids``, one ``Eagle3Layer``,
            its own final ``norm`` and ``lm_head`` over its ids). For ``"eagle3"``, ``target_config`` is the draft's
            own one-layer Llama config (:func:`~diversed_hf.drafting.eagle3.eagle3_layers_config`).
        aux_layer_ids: the target layers an ``"eagle3"`` draft fuses (transformers' ``hidden_states`` indices).
        target_hidden_size: the target's width when it is not the draft's (``"eagle3"`` only).
        own_embeddings: the draft keeps its own token embeddings (a checkpoint that ships ``embed_tokens``) instead of
            sharing the target's.
    """

    model_type = "diversed_eagle"

    def __init__(
        self,
        target_config: dict | None = None,
        num_layers: int = 1,
        draft_vocab_size: int | None = None,
        target_model_id: str | None = None,
        fc_bias: bool = False,
        input_norm: bool = False,
        final_norm: bool = False,
        architecture: str = "eagle",
        aux_layer_ids: list[int] | None = None,
        target_hidden_size: int | None = None,
        own_embeddings: bool = False,
        **kwargs,
    ):
        target_config = dict(target_config or {})
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if name not in kwargs and target_config.get(name) is not None:
                kwargs[name] = target_config[name]
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"`num_layers` must be a positive integer, got {num_layers!r}.")
        if draft_vocab_size is not None and (not isinstance(draft_vocab_size, int) or draft_vocab_size < 1):
            raise ValueError(
                f"`draft_vocab_size` must be a positive integer or None (all ids), got {draft_vocab_size!r}."
            )
        self.target_config = target_config
        self.num_layers = num_layers
        self.draft_vocab_size = draft_vocab_size
        self.target_model_id = target_model_id
        self.fc_bias, self.input_norm, self.final_norm = bool(fc_bias), bool(input_norm), bool(final_norm)
        if architecture not in ARCHITECTURES:
            raise ValueError(f"`architecture` is {architecture!r}; it must be one of {ARCHITECTURES}.")
        if architecture == "eagle3" and not aux_layer_ids:
            raise ValueError("An EAGLE-3 draft needs `aux_layer_ids`: the target layers its `fc` fuses.")
        self.architecture = architecture
        self.aux_layer_ids = None if aux_layer_ids is None else check_aux_layer_ids(aux_layer_ids)
        self.own_embeddings = bool(own_embeddings)
        # what the pair checks read (diversed_hf.common.pairs): the draft's features live in the target's hidden
        # space and its logits span the target's vocabulary
        self.hidden_size = target_config.get("hidden_size")
        self.vocab_size = target_config.get("vocab_size")
        self.target_hidden_size = target_hidden_size if target_hidden_size is not None else self.hidden_size

    @property
    def target_feature_size(self) -> int:
        """The width of the target features the draft reads: one layer's, or ``aux_layer_ids``' stacked."""
        return self.target_hidden_size * (len(self.aux_layer_ids) if self.architecture == "eagle3" else 1)

    def layers_config(self) -> PretrainedConfig:
        """The target's config cut to the draft's layers, as the config of its base model (without embeddings)."""
        if not self.target_config.get("model_type"):
            raise ValueError(
                "This EagleDraftConfig has no `target_config`: build drafts with `EagleDraft.for_target(target)` or "
                "load a saved one with `EagleDraft.from_pretrained(path)`."
            )
        values = copy.deepcopy(self.target_config)
        model_type = values.pop("model_type")
        for name in ("dtype", "torch_dtype"):  # the draft's dtype is its own (the saved one), not the target's
            values.pop(name, None)
        values["num_hidden_layers"] = self.num_layers
        if isinstance(values.get("layer_types"), list):  # per-layer attention kinds (sliding windows): the first ones
            values["layer_types"] = values["layer_types"][: self.num_layers]
        values["vocab_size"] = 1  # the base model's own embedding is dropped: the target's is attached
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):  # ids of a vocabulary the layers do not embed
            values[name] = None
        values.pop("architectures", None)
        return AutoConfig.for_model(model_type, **values)


@dataclass
class EagleDraftOutput(ModelOutput):
    """``logits`` ``(batch, kept, vocab)`` over the target's vocabulary (``-inf`` outside the draft's ids), or
    ``None``; ``last_hidden_state`` ``(batch, chunk, d)``: the predicted features ``f``; ``hidden_states``: a 1-tuple
    holding them (what the loop reads as the draft's last hidden state); ``cache``: the draft's KV cache."""

    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple | None = None
    cache: object | None = None


class EagleDraft(PreTrainedModel, GenerationMixin):
    """An EAGLE-style draft: ``fc([embed(x_j), h_{j-1}])`` -> ``num_layers`` decoder layers of the target's
    architecture -> predicted feature ``f_j`` -> the target's LM head (module docstring).

    Build one for a target with :meth:`for_target`; load a trained one with ``from_pretrained`` (then
    :meth:`attach_target`, or let ``generate`` attach it). Use it as a plain ``assistant_model``::

        draft = EagleDraft.from_pretrained("path/or/repo")
        target.generate(**inputs, assistant_model=draft, verifier=ExactVerifier())   # or diversed_head=head
    """

    config_class = EagleDraftConfig
    base_model_prefix = "eagle"
    main_input_name = "input_ids"
    _no_split_modules = []

    def __init__(self, config: EagleDraftConfig):
        super().__init__(config)
        layers_config = config.layers_config()  # refuses a config without the target's
        layout = layout_of(layers_config.model_type)  # an architecture without a layout: refused, naming it
        hidden = config.hidden_size
        if isinstance(hidden, bool) or not isinstance(hidden, int):
            raise ValueError(
                f"The target's config ({layers_config.model_type!r}) has no integer `hidden_size` (got {hidden!r}): "
                "an EagleDraft reads the target's features of that width."
            )
        eagle3 = config.architecture == "eagle3"
        self.fc = nn.Linear(config.target_feature_size if eagle3 else 2 * hidden, hidden, bias=config.fc_bias)
        # every weight in one dtype: the current default (from_pretrained's: the saved one), never the target config's
        self.model = AutoModel.from_config(layers_config, dtype=torch.get_default_dtype())
        _check_layout(self.model, layers_config.model_type, layout)
        setattr(self.model, layout.embeddings, None)  # the target's embeddings are attached, never copied or saved
        if (
            eagle3
        ):  # an Eagle3Layer first (plain layers after it); its own final norm and LM head (diversed_hf.drafting.eagle3)
            getattr(self.model, layout.layers)[0] = Eagle3Layer(layers_config, 0)
            setattr(self.model, layout.final_norm, nn.Identity())
            self.norm = LlamaRMSNorm(hidden, eps=layers_config.rms_norm_eps)
            self.lm_head = nn.Linear(hidden, config.draft_vocab_size or config.vocab_size, bias=False)
        else:
            if not config.input_norm:
                setattr(getattr(self.model, layout.layers)[0], layout.input_norm, nn.Identity())
            if not config.final_norm:
                setattr(self.model, layout.final_norm, nn.Identity())
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden) if config.own_embeddings else None
        if config.draft_vocab_size is not None:
            self.register_buffer("draft_vocab_ids", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        else:
            self.draft_vocab_ids = None
        self.register_buffer("lm_head_weight", None, persistent=False)  # (draft vocab, d): the target's rows, attached
        self.__dict__["_target_embeddings"] = None  # the target's input embedding module (not a submodule)
        self.logit_softcapping = None
        self.post_init()
        if self.generation_config is None:
            self.generation_config = GenerationConfig()

    def generate(self, *args, **kwargs):  # a GenerationMixin so its generation_config (draft-length knobs) is kept
        # reached when called directly, or from transformers' own assisted decoding (a target without enable_diversed)
        raise TypeError(
            "An EagleDraft drafts from the target's features: it cannot generate on its own, nor as the "
            "`assistant_model` of transformers' own assisted decoding, which feeds it tokens only. Call "
            "`diversed_hf.enable_diversed(target)` once, then `target.generate(..., assistant_model=draft)`."
        )

    # Construction -------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, target=None, **kwargs) -> EagleDraft:
        """A saved draft from a directory or Hub repo, in any of three formats, told apart by its ``config.json``:

        - this project's (``model_type: diversed_eagle``): ``PreTrainedModel.from_pretrained``, with the saved
          ``generation_config.json`` (the draft-length and tree knobs it carries);
        - **EAGLE-3** (``architectures: ["LlamaForCausalLMEagle3"]``: the EAGLE authors', SpecForge's, vLLM
          ``speculators``') and **EAGLE-1** (a Llama config with ``fc`` and ``layers.*``): read by
          :mod:`diversed_hf.drafting.eagle_formats`, which refuses an incomplete or foreign checkpoint by name.

        With ``target=``, :meth:`attach_target` (an EAGLE-3 checkpoint without its layer ids takes the target's
        defaults). Every weight is loaded in one dtype: ``dtype=`` when given, else the target's with ``target=``,
        else the saved one (``train_eagle_draft.py`` saves bfloat16)."""
        from .eagle_formats import detect_format, load_state, read_config, read_public, restore_drafting_knobs

        if target is not None and kwargs.get("dtype") is None and kwargs.get("torch_dtype") is None:
            kwargs["dtype"] = target.dtype
        hub_kwargs = {k: kwargs[k] for k in ("revision", "token", "cache_dir", "local_files_only") if k in kwargs}
        config = read_config(pretrained_model_name_or_path, **hub_kwargs)
        fmt = detect_format(config) if config is not None else "diversed"
        if fmt != "diversed":
            values, state = read_public(pretrained_model_name_or_path, config, target=target, **hub_kwargs)
            dtype = kwargs.get("dtype") or kwargs.get("torch_dtype")
            dtype = dtype or next(tensor.dtype for tensor in state.values() if tensor.is_floating_point())
            previous = torch.get_default_dtype()
            torch.set_default_dtype(dtype)  # every weight built in the dtype it is loaded in
            try:
                draft = cls(EagleDraftConfig(**values))
            finally:
                torch.set_default_dtype(previous)
            load_state(draft, state, pretrained_model_name_or_path, fmt)
            draft = draft.to(dtype).eval()
            return draft.attach_target(target) if target is not None else draft
        draft = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        restore_drafting_knobs(draft, pretrained_model_name_or_path, **hub_kwargs)
        return draft.attach_target(target) if target is not None else draft

    def save_pretrained(self, save_directory, *args, format: str = "diversed", **kwargs):
        """Save the draft: ``format="diversed"`` (default) in this project's layout (``PreTrainedModel``'s, with its
        generation config; ``push_to_hub`` uses it); ``"eagle3"`` in the EAGLE-3 layout vLLM's ``eagle3`` method
        loads (an EAGLE-3 draft); ``"eagle"`` in the EAGLE-1 layout vLLM's ``eagle`` method loads (an EAGLE-1-style
        draft of a Llama target: :meth:`save_for_vllm`; ``full_vocab=True`` for a draft that scores some ids only)."""
        if format == "diversed":
            from .eagle_export import refuse_export_directory

            refuse_export_directory(save_directory)  # an EAGLE export's files would be mixed with this layout's
            # a draft's generation config carries its drafting knobs; saved unmarked, so that they load again
            self.generation_config = compat.standalone_generation_config(self.generation_config)
            return super().save_pretrained(save_directory, *args, **kwargs)
        full_vocab = kwargs.pop("full_vocab", False) if format == "eagle" else False
        if args or kwargs:
            takes = "`save_directory` and `full_vocab`" if format == "eagle" else "only `save_directory`"
            raise TypeError(f"`format={format!r}` takes {takes}; got {sorted(kwargs) or list(args)}.")
        if format == "eagle3":
            from .eagle_formats import save_eagle3

            return save_eagle3(self, save_directory)
        if format == "eagle":
            return self.save_for_vllm(save_directory, full_vocab=full_vocab)
        raise ValueError(f"`format` is {format!r}; use 'diversed' (this project's), 'eagle3' or 'eagle'.")

    @classmethod
    def for_target(
        cls,
        target,
        num_layers: int = 1,
        draft_vocab_size: int | None = None,
        draft_vocab_ids: torch.Tensor | None = None,
        architecture: str = "eagle",
        aux_layer_ids: list[int] | None = None,
    ) -> EagleDraft:
        """An untrained draft for ``target`` (a causal LM of an architecture in :data:`LAYOUTS`, with
        ``get_input_embeddings`` / ``get_output_embeddings``), attached to it, in the target's dtype and on its device.

        ``draft_vocab_ids``: the ids the draft scores (e.g. the most frequent in its training data); with only
        ``draft_vocab_size`` the first ``draft_vocab_size`` ids; neither: every id. ``architecture="eagle3"``: an
        EAGLE-3 draft (its ``Eagle3Layer``, then ``num_layers - 1`` plain Llama layers of the target's width, its own
        LM head) fusing the target's layers ``aux_layer_ids`` (default ``(2, L // 2, L - 3)``), for a target of any
        architecture.
        """
        text_config = target.config.get_text_config()
        if architecture == "eagle3":
            from .eagle3 import default_aux_layer_ids, eagle3_layers_config

            layers = eagle3_layers_config(text_config, num_layers)
            ids = list(aux_layer_ids or default_aux_layer_ids(text_config.num_hidden_layers))
        else:
            layers, ids = text_config.to_dict(), None
        if draft_vocab_ids is not None:
            draft_vocab_ids = torch.as_tensor(draft_vocab_ids, dtype=torch.long).flatten()
            if draft_vocab_size is not None and draft_vocab_size != draft_vocab_ids.numel():
                raise ValueError(
                    f"`draft_vocab_size={draft_vocab_size}` but `draft_vocab_ids` holds {draft_vocab_ids.numel()} "
                    "ids: pass one of them."
                )
            draft_vocab_size = draft_vocab_ids.numel()
        config = EagleDraftConfig(
            target_config=layers,
            num_layers=num_layers,
            draft_vocab_size=draft_vocab_size,
            target_model_id=getattr(target.config, "_name_or_path", None) or None,
            architecture=architecture,
            aux_layer_ids=ids,
        )
        draft = cls(config)
        if draft_vocab_size is not None:
            ids = draft_vocab_ids if draft_vocab_ids is not None else torch.arange(draft_vocab_size)
            draft.set_draft_vocab(ids)
        if architecture == "eagle3":  # its head starts as the target's: the target's rows of its ids, the final norm
            draft._start_from_target_head(target)
        draft.to(device=target.device, dtype=target.dtype)
        return draft.attach_target(target)

    @torch.no_grad()
    def _start_from_target_head(self, target) -> None:
        """An EAGLE-3 draft's ``lm_head`` rows and ``norm`` copied from the target's LM head and final norm (as
        SpecForge starts one), so distillation starts from the target's reading of a feature."""
        weight = target.get_output_embeddings().weight.detach()  # (vocab, d)
        rows = weight if self.draft_vocab_ids is None else weight[self.draft_vocab_ids.to(weight.device)]
        self.lm_head.weight.copy_(rows.to(self.lm_head.weight.dtype))
        norm = getattr(getattr(target, "get_decoder", lambda: None)(), "norm", None)
        if getattr(norm, "weight", None) is not None and norm.weight.shape == self.norm.weight.shape:
            self.norm.weight.copy_(norm.weight.detach().to(self.norm.weight.dtype))

    def set_draft_vocab(self, ids: torch.Tensor) -> None:
        """The ids the draft scores: distinct, within the target's vocabulary, ``config.draft_vocab_size`` of them.
        An EAGLE-1-style draft keeps them sorted (its LM head is the target's rows); an EAGLE-3 draft in the order of
        its own ``lm_head``'s rows (row ``i`` scores ``ids[i]``)."""
        ids = torch.as_tensor(ids, dtype=torch.long).flatten()
        vocab = self.config.vocab_size
        if ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"`ids` holds {ids.numel()} ids; this draft scores {self.config.draft_vocab_size}.")
        if ids.unique().numel() != ids.numel() or int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"`ids` must be distinct token ids in [0, {vocab}).")
        if self.config.architecture != "eagle3":
            ids = ids.sort().values
        self.draft_vocab_ids.copy_(ids.to(self.draft_vocab_ids.device))

    def attach_target(self, target) -> EagleDraft:
        """Share ``target``'s embeddings and LM head (its rows of the draft's ids); returns the draft.

        Refused when the target's hidden size or vocabulary differs from the one the draft was built for.
        """
        text_config = target.config.get_text_config()
        for name, mine in (("hidden_size", self.config.target_hidden_size), ("vocab_size", self.config.vocab_size)):
            theirs = getattr(text_config, name, None)
            if mine != theirs:
                raise ValueError(
                    f"This EagleDraft was built for a target with {name}={mine}, and `target` has {name}={theirs}: a "
                    f"feature draft fits only its own target ({self.config.target_model_id or 'unknown id'}). Build "
                    "one for this target with `EagleDraft.for_target(target)` and train it "
                    "(training/train_eagle_draft.py)."
                )
        layers = getattr(text_config, "num_hidden_layers", None)
        if self.config.architecture == "eagle3" and layers is not None:
            check_aux_layer_ids(self.config.aux_layer_ids, layers)
        embeddings, head = target.get_input_embeddings(), target.get_output_embeddings()
        if embeddings is None or head is None or getattr(head, "weight", None) is None:
            raise ValueError(f"`target` ({type(target).__name__}) has no input embeddings or LM head to share.")
        if self.config.architecture != "eagle3":  # an EAGLE-3 draft scores with its own lm_head
            weight = head.weight.detach()  # (vocab, d)
            if self.draft_vocab_ids is not None:
                weight = weight[self.draft_vocab_ids.to(weight.device)]  # (draft vocab, d)
            self.lm_head_weight = weight
        self.__dict__["_target_embeddings"] = embeddings
        self.__dict__["_attached_to"] = weakref.ref(target)
        self.logit_softcapping = getattr(text_config, "final_logit_softcapping", None)
        return self

    def save_for_vllm(self, save_directory, *, full_vocab: bool = False):
        """Write the draft as vLLM's ``eagle`` method loads it (a Llama target): ``config.json`` (the target's Llama
        config with this draft's layers, ``EagleLlamaForCausalLM``) and ``model.safetensors`` (``fc`` and the layers;
        vLLM shares the target's embeddings and LM head). Returns the directory; serve it with
        ``speculative_config={"method": "eagle", "model": <directory>, ...}``.

        vLLM's EAGLE-1 draft scores every id: a draft with ``draft_vocab_ids`` is refused unless ``full_vocab=True``
        (:mod:`diversed_hf.drafting.eagle_export`; docs/eagle.md, "Serving with vLLM's ``eagle`` method").
        """
        from .eagle_export import save_for_vllm

        return save_for_vllm(self, save_directory, full_vocab=full_vocab)

    def is_attached_to(self, target) -> bool:
        """Whether :meth:`attach_target` was last called with this very model."""
        attached = self.__dict__.get("_attached_to")
        return attached is not None and attached() is target

    def get_input_embeddings(self):
        return self.embed_tokens if self.embed_tokens is not None else self.__dict__["_target_embeddings"]

    def set_input_embeddings(self, value):
        self.__dict__["_target_embeddings"] = value

    def get_output_embeddings(self):
        return None  # the LM head is the target's; logits span its vocabulary (config.vocab_size)

    def _init_weights(self, module):
        if module is self.fc or module is getattr(self, "lm_head", None):
            nn.init.normal_(module.weight, std=getattr(self.config.layers_config(), "initializer_range", 0.02))
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, PreTrainedModel) and module is not self:
            return
        else:
            inner = getattr(self, "model", None)
            if inner is not None and module in set(inner.modules()):
                inner._init_weights(module)

    # Forward ------------------------------------------------------------------------------------
    def _check_attached(self) -> None:
        head_missing = self.config.architecture != "eagle3" and self.lm_head_weight is None
        if head_missing or self.get_input_embeddings() is None:
            raise ValueError(
                "This EagleDraft has no target attached: its embeddings and LM head are the target's. Call "
                "`draft.attach_target(target)` (generate does it for the target it runs with)."
            )

    def features(
        self,
        input_ids: torch.Tensor,  # (batch, chunk)
        target_hidden: torch.Tensor,  # (batch, chunk, d): the feature of the column before each token
        attention_mask: torch.Tensor | None = None,  # (batch, cached + chunk)
        position_ids: torch.Tensor | None = None,  # (batch, chunk)
        cache=None,
        use_cache: bool | None = None,
    ) -> torch.Tensor:  # (batch, chunk, d) predicted features f
        """The predicted features of ``chunk`` new columns on top of ``cache``."""
        self._check_attached()
        dtype = self.fc.weight.dtype
        embeds = self.get_input_embeddings()(input_ids).to(dtype)  # (batch, chunk, d)
        if self.config.architecture == "eagle3":  # [embeddings, feature]: the Eagle3Layer splits them
            inputs = torch.cat([embeds, self._eagle3_feature(target_hidden.to(dtype))], dim=-1)  # (batch, chunk, 2 d)
        else:
            inputs = self.fc(torch.cat([embeds, target_hidden.to(dtype)], dim=-1))  # (batch, chunk, d)
        out = self.model(
            inputs_embeds=inputs,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            **({compat.CACHE_KWARG: cache} if cache is not None else {}),
        )
        return out.last_hidden_state

    def _eagle3_feature(self, hidden: torch.Tensor) -> torch.Tensor:  # (batch, chunk, k d_t) or (batch, chunk, d)
        """An EAGLE-3 draft's input feature: ``fc`` over the target's stacked layers, or its own (pre-norm) output."""
        width = hidden.shape[-1]
        if width == self.fc.in_features and width != self.config.hidden_size:
            return self.fc(hidden)
        if width != self.config.hidden_size:
            raise ValueError(
                f"`target_hidden` has width {width}; this EAGLE-3 draft reads the target's layers "
                f"{self.config.aux_layer_ids} stacked ({self.fc.in_features}) or its own features "
                f"({self.config.hidden_size}): pass `target_features(outputs.hidden_states)`."
            )
        return hidden

    def target_features(self, hidden_states: tuple) -> torch.Tensor:  # (batch, T, target_feature_size)
        """The features the draft reads from a target pass's ``hidden_states`` (``output_hidden_states=True``): the
        last one, or for an EAGLE-3 draft its ``aux_layer_ids`` stacked along the last dimension."""
        if self.config.architecture != "eagle3":
            return hidden_states[-1]
        return torch.cat([hidden_states[i] for i in self.config.aux_layer_ids], dim=-1)

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:  # (..., draft vocab)
        """Logits over the draft's ids (``draft_vocab_ids`` order; every id when it scores all)."""
        if self.config.architecture == "eagle3":
            return self.lm_head(self.norm(features))
        # as one (rows, d) x (d, vocab) product: a strided (B, 1, d) slice (a round's last column) sent to linear as
        # it is goes through a batched matmul that copies the whole head once per row (at batch 8 a third of a round)
        rows = features.reshape(-1, features.shape[-1])
        logits = nn.functional.linear(rows, self.lm_head_weight.to(features.dtype)).view(*features.shape[:-1], -1)
        if self.logit_softcapping:
            logits = torch.tanh(logits / self.logit_softcapping) * self.logit_softcapping
        return logits

    def full_logits(self, features: torch.Tensor) -> torch.Tensor:  # (..., vocab)
        """Logits over the target's whole vocabulary: ``-inf`` outside the draft's ids."""
        logits = self.draft_logits(features)
        if self.draft_vocab_ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.draft_vocab_ids, logits)

    def forward(
        self,
        input_ids: torch.Tensor,  # (batch, chunk)
        target_hidden: torch.Tensor | None = None,  # (batch, chunk, d)
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache=None,
        past_key_values=None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> EagleDraftOutput:
        """Predicted features of the chunk and logits of its last ``logits_to_keep`` columns (0: all).

        ``target_hidden[:, t]`` is the feature of the column before ``input_ids[:, t]``: the target's last hidden state
        there, or the draft's own prediction while drafting (zeros before a sequence's first token).
        """
        if target_hidden is None:
            raise ValueError(
                "An EagleDraft reads the target's hidden states (`target_hidden`, the feature of the column before "
                "each token), which a token-only drafting loop (transformers' assisted decoding) does not pass. Use "
                "it as `target.generate(..., assistant_model=draft)` on a model with `enable_diversed`, which feeds "
                "them."
            )
        cache = cache if cache is not None else past_key_values
        features = self.features(input_ids, target_hidden, attention_mask, position_ids, cache, use_cache)
        kept = features if not logits_to_keep else features[:, -logits_to_keep:]
        return EagleDraftOutput(
            logits=self.full_logits(kept), last_hidden_state=features, hidden_states=(features,), cache=cache
        )


@dataclass(frozen=True)
class EagleLayout:
    """Where the parts a draft drops or replaces live on an architecture's base model (``AutoModel``): the token
    embeddings (the target's are attached instead), the decoder layers, each layer's input norm (the first one's is
    dropped) and the final norm (dropped)."""

    embeddings: str = "embed_tokens"
    layers: str = "layers"
    input_norm: str = "input_layernorm"
    final_norm: str = "norm"


LLAMA_LAYOUT = EagleLayout()
#: the architectures an EagleDraft is built for, by the target's (text) ``model_type``; each runs the greedy-parity
#: test (tests/test_eagle.py). Another decoder: add its entry here, with its attribute names.
LAYOUTS: dict[str, EagleLayout] = {
    **{name: LLAMA_LAYOUT for name in ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3")},
    "gpt_neox": EagleLayout(embeddings="embed_in", final_norm="final_layer_norm"),
}
#: kept for callers of the earlier name: the architectures the tests run a draft with
TESTED_ARCHITECTURES = tuple(LAYOUTS)


def layout_of(model_type: str) -> EagleLayout:
    """The :class:`EagleLayout` of ``model_type``; a ``ValueError`` naming it and what to add for any other."""
    if model_type not in LAYOUTS:
        raise ValueError(
            f"EagleDraft builds its layers from the target's architecture and has no layout for model_type "
            f"{model_type!r} (it has: {', '.join(LAYOUTS)}). Add an entry to `diversed_hf.drafting.eagle.LAYOUTS` "
            "naming where its base model keeps the token embeddings, the decoder layers, each layer's input norm and "
            "the final norm (an `EagleLayout`), or use a separate small causal LM as `assistant_model`."
        )
    return LAYOUTS[model_type]


def _check_layout(model: nn.Module, model_type: str, layout: EagleLayout) -> None:
    """The base model has what ``layout`` names (a mismatch between the table and the installed transformers)."""
    layers = getattr(model, layout.layers, None)
    if not (isinstance(layers, nn.ModuleList) and len(layers) > 0 and hasattr(layers[0], layout.input_norm)):
        raise ValueError(
            f"{type(model).__name__} ({model_type!r}) has no `{layout.layers}` of decoder layers with "
            f"`{layout.input_norm}`, as `diversed_hf.drafting.eagle.LAYOUTS` says; fix its entry for this transformers "
            "version."
        )
    missing = [name for name in (layout.embeddings, layout.final_norm) if not hasattr(model, name)]
    if missing:
        raise ValueError(
            f"{type(model).__name__} ({model_type!r}) has no {', '.join(f'`{m}`' for m in missing)}, as "
            "`diversed_hf.drafting.eagle.LAYOUTS` says; fix its entry for this transformers version."
        )


AutoConfig.register(EagleDraftConfig.model_type, EagleDraftConfig, exist_ok=True)
AutoModel.register(EagleDraftConfig, EagleDraft, exist_ok=True)
register_drafter(EagleDraft, reads_target_features=True, selects_features=True)  # fed the target's features
