"""Autograd on the emulation (streamcheck/emulation/autograd.py, native/): torch's engine runs
backward passes on emulated cuda tensors through the native CUDA guard, which must be loaded before
torch. So these run programs in a fresh process: `streamcheck run --backend sim` and a pytest run
with --streamcheck-emulate-cuda re-exec themselves with it preloaded.

- grads, `autograd.Function`, `torch.autograd.grad`, tensor hooks, optimizers and `x.cuda()` of a
  tensor that requires grad compute what the same program computes on the CPU;
- each backward operator runs on its forward operator's stream, and the engine's final sync with the
  caller's stream is a sim wait: a grad used on a third stream without a wait is a race, its twin
  that waits for the caller's stream is not;
- an exception inside a backward pass ends the run in one line, the process never aborts;
- without the library (STREAMCHECK_NATIVE=0), backward() and Function.apply are refused in one
  line (exit 2) and forward passes run as under no_grad.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from streamcheck.emulation import native

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and not os.environ.get("CXX"),
                                reason="the native CUDA guard is built with a C++ compiler (g++); none here")


def streamcheck_run(tmp_path, source: str, *options, env=None) -> subprocess.CompletedProcess:
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(source))
    environ = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "streamcheck", "run", "--backend", "sim", *options, str(script)],
                          capture_output=True, text=True, cwd=tmp_path, env=environ, timeout=300)


def lines_of(done) -> dict:
    """The program's `name: value` lines."""
    return dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)


# Each section prints what it computed on cuda and whether it matches the same code on the CPU.
TRAINING = """
    import torch

    def mlp_grads(device):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(device)
        net(torch.linspace(-1, 1, 20).reshape(5, 4).to(device)).pow(2).sum().backward()
        return [p.grad for p in net.parameters()]

    grads = mlp_grads("cuda")
    print("mlp grads on:", sorted({str(g.device) for g in grads}))
    print("mlp grads match cpu:", all(torch.allclose(g.cpu(), c, atol=1e-6) for g, c in zip(grads, mlp_grads("cpu"))))

    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 3 * x * x * grad

    x = torch.arange(4.0, device="cuda", requires_grad=True)
    Cube.apply(x).sum().backward()
    print("function grad:", x.grad.tolist())

    y = torch.arange(3.0, device="cuda", requires_grad=True)
    (dy,) = torch.autograd.grad((y * y).sum(), y)
    print("autograd.grad:", dy.tolist(), dy.device)

    seen = []
    z = torch.ones(3, device="cuda", requires_grad=True)
    z.register_hook(lambda grad: seen.append(grad.sum().item()) or grad * 10)
    (z * 2).sum().backward()
    print("hook saw:", seen, "grad", z.grad.tolist())

    for name in ("SGD", "Adam"):
        params = []
        for device in ("cpu", "cuda"):
            torch.manual_seed(0)
            net = torch.nn.Linear(3, 2).to(device)
            optimizer = getattr(torch.optim, name)(net.parameters(), lr=0.1)
            for _ in range(2):
                optimizer.zero_grad()
                net(torch.ones(4, 3, device=device)).pow(2).sum().backward()
                optimizer.step()
            params.append([p.detach().cpu() for p in net.parameters()])
        print(f"{name} step matches cpu:", all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*params)))

    host = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (host.cuda() * 2).sum().backward()
    print("host grad through .cuda():", host.grad.tolist())

    # gradcheck's undefined output grads: the engine's C++ makes zero CUDA tensors itself (aten::empty
    # at the CUDA key: cuda_kernels.py).
    w = torch.randn(5, device="cuda", dtype=torch.float64, requires_grad=True)
    print("gradcheck:", torch.autograd.gradcheck(lambda t: Cube.apply(t), (w,)))
"""


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    return streamcheck_run(tmp_path_factory.mktemp("training"), TRAINING, "--schedules", "1")


def test_backward_through_an_mlp_gives_the_cpu_grads_on_the_device(training):
    assert training.returncode == 0, training.stderr
    lines = lines_of(training)
    assert lines["mlp grads on"] == "['cuda:0']"
    assert lines["mlp grads match cpu"] == "True"


def test_a_custom_function_and_autograd_grad(training):
    lines = lines_of(training)
    assert lines["function grad"] == "[0.0, 3.0, 12.0, 27.0]"
    assert lines["autograd.grad"] == "[0.0, 2.0, 4.0] cuda:0"


def test_a_tensor_hook_runs_and_its_result_is_the_grad(training):
    assert lines_of(training)["hook saw"] == "[6.0] grad [20.0, 20.0, 20.0]"


def test_optimizer_steps_change_parameters_as_on_the_cpu(training):
    lines = lines_of(training)
    assert lines["SGD step matches cpu"] == "True"
    assert lines["Adam step matches cpu"] == "True"


def test_the_grad_of_a_host_tensor_copied_to_the_device_reaches_it(training):
    assert lines_of(training)["host grad through .cuda()"] == "[2.0, 2.0, 2.0]"


def test_gradcheck_passes_with_the_cuda_tensors_the_engine_makes_itself(training):
    assert lines_of(training)["gradcheck"] == "True", training.stderr[-3000:]


def test_the_schedules_reproduce_the_reference(training):
    assert "0 printed other output than the sequential reference" in training.stderr
    assert "no races found" in training.stderr


SIDE_STREAM = """
    import sys
    import torch

    side, other = torch.cuda.Stream(), torch.cuda.Stream()
    w = torch.ones(256, device="cuda", requires_grad=True)
    x = torch.full((256,), 3.0, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        loss = (w * x).sum()
    loss.backward()  # MulBackward on `side`, then the caller's stream waits for `side`
    if "--fixed" in sys.argv:
        other.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(other):
        w.grad.mul_(0.5)
    torch.cuda.synchronize()
    print("grad:", w.grad[:2].tolist())
"""


def test_backward_runs_on_the_forward_stream_and_ends_with_the_callers_stream_waiting(tmp_path):
    # The race report names the stream of each access: the grad's write by the backward `mul` is
    # on s1, where the forward `mul` ran, not on the caller's (legacy) stream.
    racy = streamcheck_run(tmp_path, SIDE_STREAM, "--schedules", "2", "--error-exitcode", "9")
    assert racy.returncode == 9, racy.stderr
    assert "WAW race" in racy.stderr and "1 race found" in racy.stderr
    assert "first:  stream s1: `aten.mul.Tensor` writes at program.py:11" in racy.stderr
    assert "second: stream s2: `aten.mul_.Tensor` writes at program.py:15" in racy.stderr
    # The twin waits for the caller's stream only: it is ordered after the grad's write through the
    # engine's final sync (a sim event on s1 that the legacy stream waits for).
    fixed = subprocess.run([sys.executable, "-m", "streamcheck", "run", "--backend", "sim", "--schedules", "2",
                            "--error-exitcode", "9", str(tmp_path / "program.py"), "--fixed"], capture_output=True,
                           text=True, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert fixed.returncode == 0, fixed.stderr
    assert "no races found" in fixed.stderr
    assert lines_of(fixed)["grad"] == "[1.5, 1.5]"


def test_an_error_inside_a_backward_pass_ends_the_run_in_one_line(tmp_path):
    done = streamcheck_run(tmp_path, """
        import torch

        class Odd(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                torch.cuda.ExternalStream(1234)
                return grad

        x = torch.ones(4, device="cuda", requires_grad=True)
        Odd.apply(x).sum().backward()
    """)
    assert done.returncode == 2, done.stderr  # not 134 (SIGABRT): the process ended by itself
    assert done.stderr.strip().splitlines() == [
        "streamcheck run: torch.cuda.ExternalStream at program.py:11: a stream another library made (CuPy, a CUDA "
        "extension) does not exist on the sim; check this program on a GPU (streamcheck run --backend gpu)"]


FORWARD_AND_BACKWARD = """
    import torch

    w = torch.ones(3, device="cuda", requires_grad=True)
    y = (w * 2).sum()
    print("forward:", y.item(), y.requires_grad)
    y.backward()
"""


def test_without_the_library_backward_is_refused_in_one_line(tmp_path):
    done = streamcheck_run(tmp_path, FORWARD_AND_BACKWARD, env={native.SWITCH: "0"})
    assert done.returncode == 2
    assert lines_of(done)["forward"] == "6.0 False"  # run as under no_grad
    assert done.stderr.strip().splitlines()[-1] == (
        "streamcheck run: backward() at program.py:7: autograd on the sim needs streamcheck's native CUDA guard, and "
        "this run has none (STREAMCHECK_NATIVE=0 turned it off); check the forward pass here, or the backward pass "
        "on a GPU (streamcheck run --backend gpu)")


def test_without_the_library_a_custom_function_is_refused_before_the_engine(tmp_path):
    done = streamcheck_run(tmp_path, """
        import torch

        class Twice(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return grad * 2

        Twice.apply(torch.ones(2, device="cuda", requires_grad=True))
    """, env={native.SWITCH: "0"})
    assert done.returncode == 2, done.stderr
    assert "streamcheck run: Twice.apply at program.py:13: autograd on the sim needs" in done.stderr


def test_an_emulated_pytest_run_has_autograd(pytester):
    pytester.makepyfile(test_grads="""
        import torch

        def test_grads_on_the_device():
            w = torch.full((3,), 2.0, device="cuda", requires_grad=True)
            (w * w).sum().backward()
            assert w.grad.is_cuda and w.grad.tolist() == [4.0, 4.0, 4.0]
    """)
    result = pytester.runpytest_subprocess("--streamcheck-emulate-cuda", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_the_library_is_built_once_into_its_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMCHECK_CACHE_DIR", str(tmp_path))
    path = native.build()
    assert path.is_file() and path.is_relative_to(tmp_path / "native")
    built = path.stat().st_mtime_ns
    assert native.build() == path and path.stat().st_mtime_ns == built  # cached: not built again
    env = native.preload_environment(path, {"LD_PRELOAD": "libother.so"})
    assert env["LD_PRELOAD"] == f"{path} libother.so" and env[native.PRELOADED] == "1"


def test_a_missing_compiler_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMCHECK_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(native.NativeUnavailable, match=r"^the C\+\+ compiler .*no-such-compiler could not run"):
        native.build()
