"""The dispatch recorder of a trace (``inventory.hftrace``): every aten operator a model runs
(a ``TorchDispatchMode``) with the module that ran it, and every tensor autograd saves
(``saved_tensors_hooks``). Forward, an operator belongs to the innermost running module;
backward, to the module whose forward made the running autograd node."""

from __future__ import annotations

from typing import Any

from paraplan.inventory.hfrecords import ModuleCall, SavedTensor, TracedOp


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _shapes(values) -> tuple[tuple[int, ...], ...]:
    import torch

    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(tuple(int(d) for d in v.shape))
        elif isinstance(v, (list, tuple)):
            out.extend(_shapes(v))
    return tuple(out)


def _tensors(values):
    import torch

    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)


def _bytes(values) -> float:
    return float(sum(t.numel() * t.element_size() for t in _tensors(values)))


def _attention_flops(q, k, v) -> float:
    """Q K^T and P V over the full square: 2 b h s s_kv (d_qk + d_v)."""
    b, h, s, d_qk = q.shape
    s_kv, d_v = k.shape[-2], v.shape[-1]
    return 2.0 * b * h * s * s_kv * (d_qk + d_v)


def _allocations() -> frozenset:
    import torch

    aten = torch.ops.aten
    return frozenset({aten.empty, aten.empty_like, aten.new_empty, aten.empty_strided, aten.new_empty_strided})


class _Recorder:
    """Records aten operators (a TorchDispatchMode) and saved tensors (saved_tensors_hooks).

    Forward, an operator belongs to the innermost module running (a stack kept by global module
    hooks). Backward, it belongs to the module whose forward made the autograd node running
    (``torch._C._current_autograd_node``): each module's forward post-hook labels the nodes it
    made, innermost first, walking back from its outputs to its inputs."""

    def __init__(self, model, layers: dict[int, int]):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.flop_counter import flop_registry

        self.paths = {id(m): n for n, m in model.named_modules()}
        self.types = {id(m): type(m).__name__ for m in model.modules()}
        self.layers = layers  # id of each kept layer module -> its slot
        self.layer_path = {slot: self.paths[i] for i, slot in layers.items()}
        self.stack: list[Any] = []
        self.ops: list[tuple[int | None, TracedOp]] = []
        self.saved: list[tuple[int | None, SavedTensor]] = []
        self._keep: list[Any] = []  # saved tensors stay alive, so their storages are never reused
        self._seen_saved: set[int] = set()
        self._params = {p.untyped_storage()._cdata for p in model.parameters()}
        self._in_attention = False
        self._boundaries: dict[int, list] = {}
        self.module_types: dict[tuple[int | None, str], str] = {}
        # each module (and recognised function) call's boundary: what it read and returned
        self.calls: list[tuple[int | None, ModuleCall]] = []
        self._inputs: dict[int, list] = {}
        self._ids: dict[int, int] = {}  # tensor storage -> a small number, stable in one trace
        self._held: list[Any] = []  # call inputs stay alive, so their storages are never reused
        self.regions: list[tuple[Any, str]] = []  # (the module running, the function) being run
        recorder = self
        _ALLOCATIONS = _allocations()

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                if recorder._in_attention:
                    return out
                schema = func._schema
                is_view = bool(schema.returns) and all(r.alias_info is not None for r in schema.returns)
                # an allocation moves no bytes (what is written into it is counted where it is)
                is_view = is_view or func._overloadpacket in _ALLOCATIONS
                packet = func._overloadpacket
                outs = out if isinstance(out, (tuple, list)) else (out,)
                flops = 0.0
                if packet in flop_registry:
                    flops = float(flop_registry[packet](*args, **kwargs, out_val=out))
                elif torch.Tag.pointwise in func.tags:
                    flops = float(sum(t.numel() for t in _tensors(outs)))
                name = str(func).removeprefix("aten.").removesuffix(".default")
                inputs = (*args, *kwargs.values())
                recorder._record(name, inputs, outs, flops, 0.0 if is_view else _bytes(inputs),
                                 0.0 if is_view else _bytes(outs))
                return out

        self.mode = Mode()
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda x: x)

    def __enter__(self):
        import torch

        mod = torch.nn.modules.module
        self._handles = [
            mod.register_module_forward_pre_hook(self._pre),
            mod.register_module_forward_hook(self._post),
        ]
        self.mode.__enter__()
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)
        self.mode.__exit__(*exc)
        for handle in self._handles:
            handle.remove()

    def _pre(self, module, args):
        self.stack.append(module)
        self._boundaries[id(module)] = [t.grad_fn for t in _tensors(args) if t.grad_fn is not None]
        self._inputs[id(module)] = list(_tensors(args))

    def _post(self, module, args, output):
        if self.stack and self.stack[-1] is module:
            self.stack.pop()
        label = self._label(module)
        outs = list(_tensors(output if isinstance(output, (tuple, list)) else (output,)))
        if isinstance(output, dict):  # a ModelOutput
            outs += list(_tensors(list(output.values())))
        self._call(label, self._inputs.pop(id(module), []), outs)
        self._mark(label, self._boundaries.pop(id(module), []), outs)

    def _mark(self, label, boundary, outs) -> None:
        """Label the autograd nodes made between ``boundary`` (the inputs' nodes) and ``outs``
        with ``label``, unless an inner module or function labelled them first."""
        # the node objects stay referenced during the walk, so their ids are not reused
        stop = {id(n) for n in boundary}
        held: list[Any] = []
        todo = [t.grad_fn for t in outs if t.grad_fn is not None]
        seen: set[int] = set()
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen or id(node) in stop:
                continue
            seen.add(id(node))
            held.append(node)
            if "paraplan" not in node.metadata:
                node.metadata["paraplan"] = label
            todo.extend(n for n, _ in node.next_functions if n is not None)

    def _key(self, tensor) -> int:
        storage = tensor.untyped_storage()._cdata
        return self._ids.setdefault(storage, len(self._ids))

    def _call(self, label, inputs, outs) -> None:
        slot, path = label
        if slot is None:
            return
        self._held.extend(inputs)
        self.calls.append((slot, ModuleCall(
            module=path, module_type=self.module_types.get(label, ""),
            inputs=tuple((self._key(t), tuple(int(d) for d in t.shape), float(t.numel() * t.element_size()))
                         for t in inputs),
            outputs=tuple((self._key(t), tuple(int(d) for d in t.shape), float(t.numel() * t.element_size()))
                          for t in outs),
        )))

    def function(self, name: str, fn):
        """``fn`` (a function of the model's code, e.g. ``apply_rotary_pos_emb``) run as a region
        of its own: its operators and saves are labelled ``<module>.<name>``."""
        recorder = self

        def run(*args, **kwargs):
            if not recorder.stack:
                return fn(*args, **kwargs)
            inputs = list(_tensors((*args, *kwargs.values())))
            boundary = [t.grad_fn for t in inputs if t.grad_fn is not None]
            recorder.regions.append((recorder.stack[-1], name))
            label = recorder.where()
            recorder.module_types.setdefault(label, name)
            try:
                out = fn(*args, **kwargs)
            finally:
                recorder.regions.pop()
            outs = list(_tensors(out if isinstance(out, (tuple, list)) else (out,)))
            recorder._call(label, inputs, outs)
            recorder._mark(label, boundary, outs)
            return out

        return run

    def _label(self, module) -> tuple[int | None, str]:
        """(layer slot, path inside the layer) of ``module``; (None, its path) outside the layers."""
        path = self.paths.get(id(module), "")
        for slot, layer in self.layer_path.items():
            if path == layer:
                return slot, ""
            if path.startswith(layer + "."):
                return slot, path[len(layer) + 1:]
        return None, path

    def where(self) -> tuple[int | None, str]:
        """(layer slot, path inside the layer) of the module running now."""
        import torch

        node = torch._C._current_autograd_node()
        if node is not None:
            return node.metadata.get("paraplan", (None, ""))
        if not self.stack:
            return None, ""
        slot, path = self._label(self.stack[-1])
        if self.regions and self.regions[-1][0] is self.stack[-1]:
            path = f"{path}.{self.regions[-1][1]}" if path else self.regions[-1][1]
        return slot, path

    def _record(self, name, inputs, outs, flops, read, written, extra=()):
        import torch

        slot, path = self.where()
        node = torch._C._current_autograd_node()
        dtypes = [t.dtype for t in _tensors(inputs) if t.is_floating_point()] or [
            t.dtype for t in _tensors(outs)
        ] or [torch.float32]
        op = TracedOp(
            module=path,
            module_type=self.module_types.get((slot, path), ""),
            aten=name,
            phase="bwd" if node is not None else "fwd",
            shapes=_shapes(inputs),
            out_shapes=_shapes(outs),
            dtype=str(dtypes[0]).removeprefix("torch."),
            flops=flops,
            bytes_read=read,
            bytes_written=written,
            extra=tuple(extra),
        )
        self.ops.append((slot, op))

    def _pack(self, tensor):
        storage = tensor.untyped_storage()._cdata
        if storage not in self._params and storage not in self._seen_saved:
            self._seen_saved.add(storage)
            self._keep.append(tensor)
            slot, path = self.where()
            self.saved.append((slot, SavedTensor(
                module=path, shape=tuple(int(d) for d in tensor.shape),
                dtype=str(tensor.dtype).removeprefix("torch."),
                bytes=float(tensor.untyped_storage().nbytes()),
            )))
        return tensor
