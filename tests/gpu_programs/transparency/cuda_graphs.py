"""CUDA graphs: a one-stream graph (a RawKernel and ufuncs writing through out=) captured once
and replayed with new inputs, and a graph that forks onto a second stream and joins back.
Correct: every buffer a graph touches is allocated before the capture and kept alive while it is
launched (captured work writes through out=, so no temporary of the capture is freed and reused);
inputs are written, graphs launched and results read on the same stream, in that order; every
kernel runs once before its capture, so no module is loaded while capturing."""
import cupy

SOURCE = r"""
extern "C" __global__ void affine(const float* x, float* y, const float a, const float b, const int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
"""
N = 1 << 16


def main():
    affine = cupy.RawKernel(SOURCE, "affine")
    stream = cupy.cuda.Stream(non_blocking=True)
    helper = cupy.cuda.Stream(non_blocking=True)
    with stream:
        x, y, z = (cupy.zeros(N, dtype=cupy.float32) for _ in range(3))
        left, right, out = (cupy.zeros(N, dtype=cupy.float32) for _ in range(3))

    def chain():  # z = (2x + 1)^2 + x
        affine((N // 256,), (256,), (x, y, cupy.float32(2.0), cupy.float32(1.0), cupy.int32(N)))
        cupy.multiply(y, y, out=z)
        cupy.add(z, x, out=z)

    def fork_join():  # out = (x + 1) + 3x, the second term on `helper`
        with stream:
            cupy.add(x, 1.0, out=left)
        helper.wait_event(stream.record(cupy.cuda.Event(disable_timing=True)))
        with helper:
            cupy.multiply(x, 3.0, out=right)
        stream.wait_event(helper.record(cupy.cuda.Event(disable_timing=True)))
        with stream:
            cupy.add(left, right, out=out)

    with stream:
        chain()
    fork_join()

    stream.begin_capture()
    with stream:
        chain()
    graph = stream.end_capture()
    stream.begin_capture()
    fork_join()
    joined = stream.end_capture()

    chained, forked = [], []
    with stream:
        for step in range(5):
            x.fill(step)
            graph.launch(stream)
            chained.append(float(z[step]))
        for step in range(3):
            x.fill(step)
            joined.launch(stream)
            forked.append(float(out[N - 1]))
    print("chain replays", chained)
    print("fork/join replays", forked)
    stream.synchronize()
    helper.synchronize()


if __name__ == "__main__":
    main()
