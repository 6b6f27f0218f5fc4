"""A runner's weights packed for forward.c, and the call that runs it (ctypes, tensor data pointers).

`NativeForward.run` is the one entry: N tokens, each with its slot and position (decode rows, a prefill
chunk of one slot, or both), input embeddings in, logits of the rows named in `out_rows` out. The KV
cache is the runner's own tensors, stored in float16 from the moment a NativeForward is built on it
(forward.c's layout): every call passes each layer's pointer and capacity, since layers differ while the
cache grows. `packed_matrices` packs a runner's projections under the names forward.c's structures take
("{layer}.qkv", ".o", ".gate_up", ".down", "lm_head"; "embed" for an untied embedding).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator

import torch
from torch import nn

from worker.decoding.logit_stats import use_native
from worker.engine.native.bounds import KV_DTYPE, check_call
from worker.engine.native.build import load_library
from worker.engine.native.huge_pages import collapse_all
from worker.engine.native.output_buffers import OutputBuffers
from worker.engine.native.pack import SLICE_ROWS, Packed, fixed_slices, four_bit, pack_fixed, pick, pick_slices
from worker.families.skeleton import LeanGemmaRMSNorm, LeanRMSNorm, activation_name

BAD_INDEX = -2  # forward.c's status for a call whose index check failed (nothing written)
_ACTIVATIONS = {"silu": 0, "swish": 0, "gelu_pytorch_tanh": 1}  # the MLP gate's function: forward.c's `act`
# the norm classes forward.c computes: w * x / rms(x) in float32 ("rms"), or Gemma's (1 + w) ("gemma", the one
# folded into the weight at load)
_NORMS = {"rms": ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Phi3RMSNorm",
                  LeanRMSNorm.__name__),
          "gemma": ("Gemma2RMSNorm", "Gemma3RMSNorm", LeanGemmaRMSNorm.__name__)}
_MAX_HEAD_DIM = 1024  # forward.c's rotation buffer
VOCABULARY = ("lm_head", "embed")  # the packed matrices a family's `vocab_bits` sets


class NativeUnsupported(RuntimeError):
    pass


class _Matrix(ctypes.Structure):
    _fields_ = [("tiles", ctypes.c_void_p), ("bits", ctypes.c_int64), ("rows", ctypes.c_int64),
                ("cols", ctypes.c_int64)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Matrix), ("o", _Matrix), ("gate_up", _Matrix), ("down", _Matrix),
                ("qkv_bias", ctypes.c_void_p), ("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p),
                ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p), ("attn_out_norm", ctypes.c_void_p),
                ("mlp_out_norm", ctypes.c_void_p), ("rope_cos", ctypes.c_void_p), ("rope_sin", ctypes.c_void_p),
                ("window", ctypes.c_int64)]


class _Model(ctypes.Structure):
    _fields_ = [("layers", ctypes.c_int64), ("hidden", ctypes.c_int64), ("heads", ctypes.c_int64),
                ("kv_heads", ctypes.c_int64), ("head_dim", ctypes.c_int64), ("inter", ctypes.c_int64),
                ("max_positions", ctypes.c_int64), ("eps", ctypes.c_float), ("attn_scale", ctypes.c_float),
                ("rope_cos", ctypes.c_void_p), ("rope_sin", ctypes.c_void_p), ("final_norm", ctypes.c_void_p),
                ("head", _Matrix), ("layer", ctypes.POINTER(_Layer)), ("act", ctypes.c_int64),
                ("attn_softcap", ctypes.c_float)]


def _matrix(packed: Packed) -> _Matrix:
    if not packed.tiles.is_contiguous() or packed.tiles.dtype != torch.uint8:
        raise ValueError("a packed matrix's tiles must be a contiguous uint8 tensor")
    return _Matrix(packed.tiles.data_ptr(), packed.bits, packed.rows, packed.cols)


def _float(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().float().contiguous()


def _family_gaps(runner) -> list[str]:
    """What the runner's family uses (worker/families/family.py) that forward.c does not compute: Llama's layer, with
    Gemma's (1 + w) norms, output norms, windows, rotary tables per layer type and soft-caps."""
    family, plans = runner.family, runner.plans
    gaps = [f"{family.norm} norms" for _ in [0] if family.norm not in _NORMS]
    gaps += [what for what, used in (
        ("a layer without its input or MLP norm", any(p.input_norm is None or p.mlp_norm is None for p in plans)),
        ("q/k norms over all heads", family.qk_norm == "full"),
        ("a parallel residual", any(p.parallel for p in plans)),
        ("mixture-of-experts MLPs", family.moe),
        ("an ungated MLP", not family.gated),
        ("partial rotary", runner.rotary_dim != runner.head_dim),
        ("a q/k/v layout by head", family.qkv_by_head),
        ("an embedding scale it cannot read", hasattr(runner.embed_tokens, "embed_scale")
         and not hasattr(runner.embed_tokens, "scalar_embed_scale"))) if used]
    return gaps


def _norms(plan) -> list:
    """The layer's norms (layers.Norm) that forward.c applies."""
    return [norm for norm in (plan.input_norm, plan.mlp_norm, plan.attention_out_norm, plan.mlp_out_norm,
                              plan.q_norm, plan.k_norm) if norm is not None]


def _norm_weight(norm) -> torch.Tensor:
    """The weight forward.c multiplies by: Gemma's 1 + w (as its norm computes it, in float32), else w."""
    weight = _float(norm.weight)
    return 1.0 + weight if norm.kind == "gemma" else weight


def check_supported(runner) -> None:
    """Raise NativeUnsupported unless forward.c computes this runner's model."""
    config = runner.model.config
    gaps = _family_gaps(runner)
    if gaps:
        raise NativeUnsupported(f"{runner.family.name}: {', '.join(gaps)} not in the native q4 forward")
    if runner.device.type != "cpu" or runner.dtype != torch.float32:
        raise NativeUnsupported("q4 runs on the CPU in float32")
    if runner._rope_tables is None:
        raise NativeUnsupported("q4 needs static rotary tables (no dynamic / longrope scaling)")
    if activation_name(config) not in _ACTIVATIONS or runner.head_dim > _MAX_HEAD_DIM:
        raise NativeUnsupported("q4 supports SiLU- or GELU(tanh)-gated MLPs and head_dim <= 1024")
    if len({plan.scale for plan in runner.plans}) != 1 or len({plan.softcap for plan in runner.plans}) != 1:
        raise NativeUnsupported("q4 needs one attention scale and soft-cap for every layer")
    if runner.family.vocab_bits not in (None, 4, 8):
        raise NativeUnsupported(f"q4 packs a vocabulary in 4 or 8 bits, not {runner.family.vocab_bits}")
    if runner.heads % runner.kv_heads:
        raise NativeUnsupported("q4 needs heads to be a multiple of kv_heads")
    for plan, fused in zip(runner.plans, runner.fused):
        if fused.qkv is None or fused.gate_up is None:
            raise NativeUnsupported("q4 needs plain Linear projections and a gated MLP")
        if fused.o_proj.bias is not None or fused.down_proj.bias is not None:
            raise NativeUnsupported("q4 supports a bias on q/k/v only")
        for norm in _norms(plan):
            if type(norm.module).__name__ not in _NORMS.get(norm.kind, ()):
                raise NativeUnsupported(f"q4 does not run {type(norm.module).__name__}")
    if type(runner.lm_head) is not nn.Linear or runner.lm_head.bias is not None:
        raise NativeUnsupported("q4 needs a plain vocabulary projection")


def matrix_sources(runner) -> dict[str, list[nn.Module]]:
    """Each packed matrix's modules, whose weights it stacks (q, k, v; gate, up)."""
    sources: dict[str, list[nn.Module]] = {}
    for index, plan in enumerate(runner.plans):
        sources.update({f"{index}.qkv": plan.qkv_modules, f"{index}.o": [plan.out],
                        f"{index}.gate_up": plan.gate_up_modules, f"{index}.down": [plan.down]})
    if runner.lm_head.weight is runner.embed_tokens.weight:  # tied: the vocabulary matrix is the embedding
        sources["lm_head"] = [runner.embed_tokens]
    else:
        sources.update({"lm_head": [runner.lm_head], "embed": [runner.embed_tokens]})
    return sources


def packed_matrices(runner, read: Callable[[str], torch.Tensor] | None = None) -> dict[str, Packed]:
    """Every matrix of `matrix_sources` packed (`pick`), one at a time. A weight left unread at load (meta) is
    read by its state-dict name through `read`; where `read` has `four_bit` (a GGUF's reader) and gives the
    file's 4-bit codes for each part of a matrix, those are packed as they are (pack.four_bit)."""
    names = {module: name for name, module in runner.model.named_modules()}

    def weight(module: nn.Module) -> torch.Tensor:
        if not module.weight.is_meta:
            return module.weight.detach()
        if read is None:
            raise NativeUnsupported(f"{names[module]}.weight was not loaded and nothing can read it")
        return read(f"{names[module]}.weight")

    def as_stored(modules: list[nn.Module]) -> Packed | None:
        """The matrix from the file's own 4-bit codes, where `read` offers them for every unread part."""
        stored = getattr(read, "four_bit", None)
        if stored is None or not all(m.weight.is_meta for m in modules):
            return None
        parts = [stored(f"{names[m]}.weight") for m in modules]
        if any(part is None for part in parts):
            return None
        return four_bit(*(torch.cat(tensors) for tensors in zip(*parts)))

    def streamed(modules: list[nn.Module]) -> Callable[[], Iterator[torch.Tensor]] | None:
        """An unread matrix's rows, a slice at a time, where `read` offers them (a GGUF's reader)."""
        slices = getattr(read, "row_slices", None)
        if slices is None or len(modules) != 1 or not modules[0].weight.is_meta:
            return None
        return slices(f"{names[modules[0]]}.weight", SLICE_ROWS)

    vocab_bits = runner.family.vocab_bits

    def packed(name: str, modules: list[nn.Module]) -> Packed:
        try:
            fixed = vocab_bits if name in VOCABULARY else None
            stored = as_stored(modules) if fixed in (None, 4) else None
            if stored is not None:
                return stored
            slices = streamed(modules)
            if slices is not None:
                rows = modules[0].weight.shape[0]
                return pick_slices(slices, rows) if fixed is None else fixed_slices(slices, rows, fixed)
            whole = torch.cat([weight(m) for m in modules]) if len(modules) > 1 else weight(modules[0])
            return pick(whole) if fixed is None else pack_fixed(whole, fixed)
        except ValueError as error:  # weights pack.py cannot hold
            raise NativeUnsupported(f"q4 cannot pack {name}: {error}") from None

    # the largest first (the vocabulary matrices): a float copy read to pack one then sits beside few packed
    # matrices, not beside all of them (a cold start's peak RSS)
    largest_first = sorted(matrix_sources(runner).items(), key=lambda item: -sum(m.weight.numel() for m in item[1]))
    return {name: packed(name, modules) for name, modules in largest_first}


class NativeForward:
    def __init__(self, runner, threads: int | None = None, matrices: dict[str, Packed] | None = None,
                 huge_page_regions: list[torch.Tensor] | None = None):
        """`matrices`: `packed_matrices(runner)` (as the pack cache kept it), else packed here.
        `huge_page_regions`: their memory for `collapse_pages` (huge_pages.in_huge_pages), else none."""
        check_supported(runner)
        self.library = load_library()
        self.library.sluice_native_forward.restype = ctypes.c_int
        use_native(self.library)  # the token choice's reductions, compiled into the same library
        self.threads = threads or max(1, min(len(os.sched_getaffinity(0)), 64))
        self.hidden_size, self.vocab_size = runner.hidden_size, runner.vocab_size
        self._keep: list[torch.Tensor] = []  # everything a pointer in the structures refers to
        self._outputs = OutputBuffers()  # the logits' memory, kept between calls
        self.huge_page_regions = huge_page_regions or []  # the matrices' memory to collapse (huge_pages.py)
        first = runner.plans[0]
        epsilons = {norm.eps for plan in runner.plans for norm in _norms(plan)} | {runner.norm.eps}
        if len(epsilons) != 1:
            raise NativeUnsupported("q4 needs one RMSNorm epsilon for every norm")
        self.matrices = packed_matrices(runner) if matrices is None else matrices
        # every table as long as the runner's context: forward.c checks positions against the first one's rows
        tables = {key: tuple(self._hold(_float(t)) for t in table) for key, table in runner._rope_tables.items()}
        cos, sin = next(iter(tables.values()))
        layers = (_Layer * len(runner.layers))()
        for index, (plan, fused) in enumerate(zip(runner.plans, runner.fused)):
            packed = {name: self.matrices[f"{index}.{name}"] for name in ("qkv", "o", "gate_up", "down")}
            bias = None if fused.qkv.bias is None else self._hold(_float(fused.qkv.bias)).data_ptr()
            norms = [None if norm is None else self._hold(_norm_weight(norm)).data_ptr()
                     for norm in (plan.input_norm, plan.mlp_norm, plan.q_norm, plan.k_norm, plan.attention_out_norm,
                                  plan.mlp_out_norm)]
            own_cos, own_sin = tables[plan.rope]
            layers[index] = _Layer(*(_matrix(packed[name]) for name in ("qkv", "o", "gate_up", "down")), bias, *norms,
                                   own_cos.data_ptr(), own_sin.data_ptr(), plan.window or 0)
        scale = first.scale or runner.head_dim ** -0.5
        head = self.matrices["lm_head"]
        self._layers = layers
        self._model = _Model(len(runner.layers), runner.hidden_size, runner.heads, runner.kv_heads, runner.head_dim,
                             first.down.weight.shape[1], cos.shape[0], float(runner.norm.eps), float(scale),
                             cos.data_ptr(), sin.data_ptr(), self._hold(_norm_weight(runner.norm)).data_ptr(),
                             _matrix(head), layers, _ACTIVATIONS[activation_name(runner.model.config)],
                             float(first.softcap or 0.0))
        self.logit_softcap = runner.logit_softcap  # applied to the logits forward.c returns (Gemma 2)
        if runner.cache.dtype != KV_DTYPE:
            runner.cache.store_as(KV_DTYPE)

    def collapse_pages(self) -> int:
        """The matrices' memory into 2 MiB pages where the kernel gives them (huge_pages.py; seconds of kernel
        time on a fragmented host: the worker calls it in a thread once ready); the bytes moved."""
        return collapse_all(self.huge_page_regions)

    def _hold(self, tensor: torch.Tensor) -> torch.Tensor:
        self._keep.append(tensor)
        return tensor

    def run(self, hidden: torch.Tensor, slots: list[int], positions: list[int], keys: list[torch.Tensor],
            values: list[torch.Tensor], out_rows: list[int], want_logits: bool = True,
            want_hidden: bool = False, threads: int | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """hidden: [N, hidden] float32 input embeddings (overwritten: the residual stream). Writes each token's
        key/value at (slot, position) in every layer; returns (logits [len(out_rows), vocab] or None, final
        normed hidden states of those rows or None). `threads`: fewer than `self.threads` on a busy host."""
        hidden = hidden.contiguous()
        check_call(hidden=hidden, hidden_size=self.hidden_size, slots=slots, positions=positions, keys=keys,
                   values=values, out_rows=out_rows, layers=self._model.layers, kv_heads=self._model.kv_heads,
                   head_dim=self._model.head_dim, max_positions=self._model.max_positions)
        return self._call(hidden, slots, positions, keys, values, out_rows, want_logits, want_hidden, threads)

    def _call(self, hidden: torch.Tensor, slots: list[int], positions: list[int], keys: list[torch.Tensor],
              values: list[torch.Tensor], out_rows: list[int], want_logits: bool, want_hidden: bool,
              threads: int | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """`run` past its checks: forward.c's own index guard is all that stands between this and the cache."""
        count, wanted = len(slots), len(out_rows)
        slot_index = torch.tensor(slots, dtype=torch.int32)
        position_index = torch.tensor(positions, dtype=torch.int32)
        rows = torch.tensor(out_rows, dtype=torch.int32)
        logits = self._outputs.empty(wanted, self.vocab_size) if want_logits and wanted else None
        normed = torch.empty(wanted, self.hidden_size) if want_hidden and wanted else None
        layers = len(keys)
        key_pointers = (ctypes.c_void_p * layers)(*(t.data_ptr() for t in keys))
        value_pointers = (ctypes.c_void_p * layers)(*(t.data_ptr() for t in values))
        capacities = (ctypes.c_int64 * layers)(*(t.shape[2] for t in keys))
        slot_count = min(t.shape[0] for t in keys)
        status = self.library.sluice_native_forward(
            ctypes.byref(self._model), ctypes.c_int64(count), ctypes.c_void_p(slot_index.data_ptr()),
            ctypes.c_void_p(position_index.data_ptr()), ctypes.c_void_p(hidden.data_ptr()), key_pointers,
            value_pointers, capacities, ctypes.c_int64(slot_count), ctypes.c_int64(wanted),
            ctypes.c_void_p(rows.data_ptr()), ctypes.c_void_p(None if logits is None else logits.data_ptr()),
            ctypes.c_void_p(None if normed is None else normed.data_ptr()),
            ctypes.c_int(min(threads or self.threads, self.threads)))
        if status == BAD_INDEX:
            raise ValueError("the native forward refused a slot, position or output row out of range")
        if status != 0:
            raise MemoryError("the native forward could not allocate its scratch memory")
        if logits is not None and self.logit_softcap is not None:  # cap * tanh(logits / cap), runner._capped's ops
            logits.div_(self.logit_softcap).tanh_().mul_(self.logit_softcap)
        return logits, normed
