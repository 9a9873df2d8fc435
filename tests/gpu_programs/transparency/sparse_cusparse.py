"""cupyx.scipy.sparse through cuSPARSE: CSR matrix x vector, transpose + tocsr, sparse x sparse,
the iterative cg solver and the direct spsolve (cuSOLVER's sparse QR, which a CUDA build may lack:
the program then says so, identically in both runs). Everything runs on the legacy default stream,
and every value is read with a blocking copy."""
import cupy


def main():
    n = 1000
    main_diag = cupy.full(n, 4.0)
    off_diag = cupy.full(n - 1, -1.0)
    import cupyx.scipy.sparse as sparse  # imported after CuPy's first use, as a program would
    import cupyx.scipy.sparse.linalg as sparse_linalg

    a = sparse.diags([off_diag, main_diag, off_diag], [-1, 0, 1], format="csr")
    print("csr", a.shape, "nnz", a.nnz, a.format)
    x = cupy.arange(n, dtype=cupy.float64) % 7
    y = a @ x
    print("spmv sum", f"{float(y.sum()):.4f}", "head", y[:4].get().tolist())

    r = sparse.random(200, 100, density=0.05, format="csr", dtype=cupy.float64, random_state=0)
    rt = r.T.tocsr()
    print("random nnz", r.nnz, "transpose", rt.shape, rt.format, "data sum", f"{float(r.data.sum()):.4f}")
    print("transpose matches dense", bool(cupy.all(rt.toarray() == r.toarray().T)))
    v = cupy.linspace(0.0, 1.0, 200)
    print("r.T @ v", f"{float((rt @ v).sum()):.4f}")

    a2 = a @ a  # sparse x sparse: pentadiagonal
    print("a @ a nnz", a2.nnz, "sum", f"{float(a2.sum()):.1f}")

    b = cupy.ones(n)
    sol, info = sparse_linalg.cg(a, b, maxiter=200)
    residual = float(cupy.linalg.norm(a @ sol - b))
    print("cg info", info, "residual small", residual < 1e-2, "mean", f"{float(sol.mean()):.3f}")
    try:
        direct = sparse_linalg.spsolve(a, b)
        print("spsolve matches cg", bool(cupy.abs(direct - sol).max() < 1e-3))
    except Exception as exc:  # a CUDA without cusolverSp: same in both runs
        print("spsolve unavailable:", type(exc).__name__)


if __name__ == "__main__":
    main()
