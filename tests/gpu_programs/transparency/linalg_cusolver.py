"""cupy.linalg through cuSOLVER and cuBLAS: eigh, eigvalsh, svd, solve, qr, inv, cholesky, slogdet,
on the legacy default stream and on a non-blocking stream. Correct: every value is read on the
stream that computed it (a blocking read), and the non-blocking stream builds its own inputs."""
import numpy

import cupy


def fmt(values):
    return " ".join(f"{float(v):.4f}" for v in values)


def main():
    rng = numpy.random.default_rng(1234)
    m = rng.standard_normal((64, 64))
    spd = m @ m.T + 64.0 * numpy.eye(64)  # symmetric positive definite, well conditioned
    a = cupy.asarray(spd)
    rhs = cupy.asarray(rng.standard_normal((64, 3)))
    eye = cupy.eye(64)

    w, v = cupy.linalg.eigh(a)
    print("eigh lowest", fmt(w[:3].get()), "highest", fmt(w[-2:].get()))
    print("eigh residual small", bool(cupy.abs(a @ v - v * w).max() < 1e-8))
    u, s, vt = cupy.linalg.svd(a[:, :48])
    print("svd top", fmt(s[:3].get()), "rank", int(cupy.count_nonzero(s > 1e-10)), "u", u.shape, "vt", vt.shape)
    x = cupy.linalg.solve(a, rhs)
    print("solve residual small", bool(cupy.abs(a @ x - rhs).max() < 1e-9), "x[0]", fmt(x[0].get()))
    q, r = cupy.linalg.qr(a)
    print("qr orthogonal", bool(cupy.abs(q.T @ q - eye).max() < 1e-10),
          "|diag r| sum", f"{float(cupy.abs(r.diagonal()).sum()):.4f}")
    inv = cupy.linalg.inv(a)
    print("inv identity", bool(cupy.abs(inv @ a - eye).max() < 1e-10), "trace", f"{float(inv.trace()):.6f}")
    chol = cupy.linalg.cholesky(a)
    print("cholesky lower", bool(cupy.all(cupy.triu(chol, 1) == 0)),
          "reconstructs", bool(cupy.abs(chol @ chol.T - a).max() < 1e-9))
    sign, logdet = cupy.linalg.slogdet(a)
    print("slogdet sign", f"{float(sign):.1f}", "logdet", f"{float(logdet):.4f}")

    side = cupy.cuda.Stream(non_blocking=True)
    with side:  # cuSOLVER's handle follows the current stream
        small = cupy.asarray(spd[:32, :32])
        lo = cupy.linalg.eigvalsh(small)
        sol = cupy.linalg.solve(small, cupy.ones(32))
        print("side stream eigvalsh", fmt(lo[:2].get(stream=side)), "solve[0]", f"{float(sol[0]):.6f}")
    side.synchronize()


if __name__ == "__main__":
    main()
