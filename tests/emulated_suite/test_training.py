"""Training on the GPU: backward, an optimizer step, a custom autograd Function, and gradients
handed to a communication stream."""
import pytest
import torch
import torch.nn.functional as F

TEST_CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not TEST_CUDA, reason="CUDA not available")


class ScaledSquare(torch.autograd.Function):
    """scale * x**2, with its gradient written out."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return scale * x * x

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * 2 * ctx.scale * x, None


def test_backward_gives_the_analytic_gradient():
    w = torch.tensor([1.0, -2.0, 3.0], device="cuda", requires_grad=True)
    (w ** 3).sum().backward()
    assert w.grad.is_cuda
    assert torch.allclose(w.grad, 3 * w.detach() ** 2)


def test_custom_autograd_function_forward_and_backward():
    x = torch.tensor([0.5, -1.0, 2.0], device="cuda", requires_grad=True)
    y = ScaledSquare.apply(x, 3.0)
    assert torch.allclose(y.detach(), 3.0 * x.detach() ** 2)
    y.sum().backward()
    assert torch.allclose(x.grad, 6.0 * x.detach())


def test_custom_autograd_function_passes_gradcheck():
    x = torch.randn(5, device="cuda", dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ScaledSquare.apply(t, 1.5), (x,))


def test_training_steps_reduce_the_loss(fresh_model, batch):
    x, target = batch
    optimizer = torch.optim.SGD(fresh_model.parameters(), lr=0.05)
    losses = []
    for _ in range(20):
        optimizer.zero_grad()
        loss = F.mse_loss(fresh_model(x), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(p.grad is not None and p.grad.is_cuda for p in fresh_model.parameters())
    assert losses[-1] < 0.5 * losses[0]


def test_adam_step_moves_every_parameter(fresh_model, batch):
    x, target = batch
    before = [p.detach().clone() for p in fresh_model.parameters()]
    optimizer = torch.optim.Adam(fresh_model.parameters(), lr=1e-2)
    F.mse_loss(fresh_model(x), target).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    assert all(not torch.equal(b, p.detach()) for b, p in zip(before, fresh_model.parameters()))
    assert all(p.grad is None for p in fresh_model.parameters())


def test_eval_model_is_deterministic(eval_model, batch):
    x, _ = batch
    with torch.no_grad():
        first, second = eval_model(x), eval_model(x)
    assert first.shape == (64, 1) and first.is_cuda
    assert torch.equal(first, second)


def test_eval_model_scores_one_sample(eval_model):
    with torch.no_grad():
        score = eval_model(torch.zeros(1, 8, device="cuda"))
    assert score.shape == (1, 1) and torch.isfinite(score).all()


def test_race_grads_bucketed_before_backward_is_done(fresh_model, batch, side_stream):
    x, target = batch
    F.mse_loss(fresh_model(x), target).backward()
    expected = torch.cat([p.grad.flatten() for p in fresh_model.parameters()])
    # BUG: the communication stream never waits for the backward kernels (on the current stream)
    with torch.cuda.stream(side_stream):
        bucket = torch.cat([p.grad.flatten() for p in fresh_model.parameters()])
    torch.cuda.current_stream().wait_stream(side_stream)
    assert torch.equal(bucket, expected)


def test_fixed_grads_bucketed_before_backward_is_done(fresh_model, batch, side_stream):
    x, target = batch
    F.mse_loss(fresh_model(x), target).backward()
    expected = torch.cat([p.grad.flatten() for p in fresh_model.parameters()])
    side_stream.wait_stream(torch.cuda.current_stream())  # the gradients are written first
    with torch.cuda.stream(side_stream):
        bucket = torch.cat([p.grad.flatten() for p in fresh_model.parameters()])
    torch.cuda.current_stream().wait_stream(side_stream)
    assert torch.equal(bucket, expected)
