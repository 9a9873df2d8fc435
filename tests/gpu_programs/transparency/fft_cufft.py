"""cupy.fft through cuFFT: fft/ifft, rfft2/irfft2, fftn/fftshift (the last on a non-blocking
stream). Correct: each result is read on the stream that computed it."""
import math

import numpy

import cupy


def main():
    n = 4096
    t = numpy.arange(n) / n
    signal = numpy.sin(2 * math.pi * 50 * t) + 0.5 * numpy.cos(2 * math.pi * 120 * t)
    x = cupy.asarray(signal)
    spectrum = cupy.fft.fft(x)
    mag = cupy.abs(spectrum)
    peaks = sorted(int(p) for p in cupy.argsort(mag[: n // 2])[-2:].get())
    print("fft peaks", peaks, "magnitudes", [f"{float(mag[p]):.3f}" for p in peaks])
    back = cupy.fft.ifft(spectrum).real
    print("ifft roundtrip", bool(cupy.abs(back - x).max() < 1e-12))

    rng = numpy.random.default_rng(7)
    img = cupy.asarray(rng.standard_normal((256, 256)).astype(numpy.float32))
    spec2 = cupy.fft.rfft2(img)
    print("rfft2", spec2.shape, spec2.dtype)
    print("rfft2 dc is the sum", abs(float(spec2[0, 0].real) - float(img.sum())) < 1e-2)
    rec = cupy.fft.irfft2(spec2, s=img.shape)
    print("irfft2 roundtrip", bool(cupy.abs(rec - img).max() < 1e-4))

    side = cupy.cuda.Stream(non_blocking=True)
    with side:  # cuFFT plans run on the current stream
        cube = cupy.fft.fftshift(cupy.fft.fftn(cupy.ones((8, 8, 8), dtype=cupy.complex128)))
        center = complex(cube[4, 4, 4])
        total = float(cupy.abs(cube).sum())
    print("fftn center", f"{center.real:.1f}", "total", f"{total:.1f}")
    side.synchronize()


if __name__ == "__main__":
    main()
