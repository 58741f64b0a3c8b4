"""``torch.compile(fullgraph=True)`` traces the Triton norms' custom ops (``normlab::triton_*``) and
computes what eager computes, forward and backward, DyT's ``alpha`` gradient included.

Compiled with inductor's CPU backend, the kernels under the Triton interpreter
(``tests/conftest.py``); on the GPU check's device (``NORMLAB_TEST_DEVICE=cuda``) with inductor's
CUDA backend, the kernels compiled. Each test compiles one ``Linear -> norm -> Linear`` module.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from .conftest import triton_device

pytest.importorskip("triton")
DEVICE = triton_device()

import normlab.norms.triton_impl as tk  # noqa: E402
from normlab.training.setup import forbid_eager_fallback  # noqa: E402

D = 32


class _Net(nn.Module):
    def __init__(self, norm: nn.Module):
        super().__init__()
        self.inp, self.norm, self.out = nn.Linear(D, D), norm, nn.Linear(D, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.inp(x)))


def _run(net: nn.Module, fn, x: torch.Tensor, dy: torch.Tensor) -> dict[str, torch.Tensor]:
    """Output, input gradient and every parameter's gradient of ``fn(x)`` backpropagating ``dy``."""
    net.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    y = fn(x)
    y.backward(dy)
    return {"y": y.detach(), "x.grad": x.grad, **{n: p.grad for n, p in net.named_parameters()}}


def _norm(kind: str, bias: bool) -> nn.Module:
    if kind == "rms":
        return tk.TritonRMSNorm(D, 1e-5)
    cls = tk.TritonLayerNorm if kind == "layer" else tk.TritonDyT
    return cls(D, 1e-5, bias=bias)


#: ``(kind, bias)``; ids name the implementation as the contract's do (the GPU check ranks by it).
COMPILE_CASES = [
    pytest.param(kind, bias, id=f"{kind}-triton-{'bias' if bias else 'no_bias'}")
    for kind, bias in [
        ("rms", False),
        ("layer", False),
        ("layer", True),
        ("dyt", False),
        ("dyt", True),
    ]
]


@pytest.mark.device
@pytest.mark.parametrize(("kind", "bias"), COMPILE_CASES)
def test_triton_norm_under_torch_compile_matches_eager_forward_and_backward(cfg_tiny, kind, bias):
    from torch._inductor.compile_fx import compile_fx

    torch.manual_seed(0)
    net = _Net(_norm(kind, bias)).to(DEVICE)
    with torch.no_grad():  # parameters off their initial ones / zeros, so each one matters
        for p in net.norm.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x, dy = torch.randn(2, 8, D, device=DEVICE), torch.randn(2, 8, 16, device=DEVICE)
    eager = _run(net, net, x, dy)

    graphs: list[torch.fx.GraphModule] = []

    def inductor(gm, example_inputs):  # inductor, recording what dynamo hands it
        graphs.append(gm)
        return compile_fx(gm, example_inputs)

    torch._dynamo.reset()
    with forbid_eager_fallback(cfg_tiny("compile=true")):
        compiled = _run(net, torch.compile(net, backend=inductor, fullgraph=True), x, dy)
    torch._dynamo.reset()

    assert len(graphs) == 1
    targets = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
    op = "normlab.triton_dyt_fwd" if kind == "dyt" else "normlab.triton_norm_fwd"
    assert any(op in t for t in targets), f"{op} not in the compiled graph: {sorted(targets)}"
    assert compiled.keys() == eager.keys()
    for name, want in eager.items():
        tag = lambda m, name=name: f"{name}: {m}"  # noqa: E731
        torch.testing.assert_close(compiled[name], want, rtol=1e-5, atol=1e-6, msg=tag)
    if kind == "dyt":
        assert eager["norm.alpha"].abs().item() > 1e-3, "the alpha gradient checked is ~0"


@pytest.mark.device
def test_triton_custom_ops_have_consistent_schemas_fakes_and_autograd():
    """``torch.library.opcheck``: each op's fake gives the real outputs' shapes, dtypes and strides,
    its schema (no mutation, no aliasing) holds, and its autograd is registered for compile."""
    x, dy = torch.randn(2, 3, D, device=DEVICE), torch.randn(2, 3, D, device=DEVICE)
    w, b = torch.randn(D, device=DEVICE), torch.randn(D, device=DEVICE)
    alpha = torch.full((1,), 0.5, device=DEVICE)
    _, mean, rstd = tk._norm_fwd_op(x, w, b, 1e-5, False, False)
    xg, ag = x.clone().requires_grad_(), alpha.clone().requires_grad_()
    cases = [
        (tk._norm_fwd_op, (xg, w, b, 1e-5, False, False)),
        (tk._norm_fwd_op, (xg, None, None, 1e-5, True, True)),
        (tk._norm_bwd_op, (dy, x, w, True, mean, rstd, False, False)),
        (tk._norm_bwd_op, (dy, x, None, False, None, rstd, True, True)),
        (tk._dyt_fwd_op, (xg, ag, w, b, False)),
        (tk._dyt_fwd_op, (xg, ag, None, None, True)),
        (tk._dyt_bwd_op, (dy, x, alpha, w, True, False)),
        (tk._dyt_bwd_op, (dy, x.double(), alpha.double(), None, False, True)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)
