"""cupyx.scipy.ndimage: gaussian_filter, convolve, uniform_filter, sobel, median_filter, label,
zoom, on the legacy default stream. Values are read with blocking copies."""
import cupy


def main():
    img = cupy.zeros((256, 256), dtype=cupy.float32)
    img[96:160, 96:160] = 1.0
    img[20, 30] = 5.0
    import cupyx.scipy.ndimage as ndimage  # imported after CuPy's first use, as a program would

    smooth = ndimage.gaussian_filter(img, sigma=3.0)
    print("gaussian sum", f"{float(smooth.sum()):.3f}", "center", f"{float(smooth[128, 128]):.4f}",
          "edge", f"{float(smooth[96, 128]):.4f}")
    laplace = cupy.asarray([[0, 1, 0], [1, -4, 1], [0, 1, 0]], dtype=cupy.float32)
    lap = ndimage.convolve(img, laplace, mode="constant")
    print("laplacian min", float(lap.min()), "max", float(lap.max()), "sum", float(lap.sum()))
    box = ndimage.uniform_filter(img, size=5)
    print("uniform filter corner", f"{float(box[96, 96]):.4f}", "inside", f"{float(box[128, 128]):.4f}")
    edges = ndimage.sobel(img, axis=0)
    print("sobel abs sum", f"{float(cupy.abs(edges).sum()):.2f}")
    median = ndimage.median_filter(img, size=3)
    print("median removes the spike", float(median[20, 30]), "keeps the square", float(median[128, 128]))
    labels, count = ndimage.label(img > 0)
    print("labels", int(count), "square label size", int((labels == labels[128, 128]).sum()))
    half = ndimage.zoom(img, 0.5, order=1)
    print("zoom", half.shape, "sum", f"{float(half.sum()):.2f}")


if __name__ == "__main__":
    main()
