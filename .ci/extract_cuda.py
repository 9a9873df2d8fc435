"""Write the CUDA C sources embedded in Python files (string constants holding a
`__global__` kernel, as cupy.RawKernel takes them) to OUT_DIR as .cu files, so
compile_cuda.sh compiles them with the checked-in .cu sources.

    python3 .ci/extract_cuda.py OUT_DIR FILE.py...

Reads the files with `ast` (nothing is imported: CI has no cupy). Prints the files written.
"""
import ast
import sys
from pathlib import Path


def embedded_sources(path: Path):
    """(name, source) of each module-level string constant that defines a CUDA kernel."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str) and "__global__" in node.value.value:
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            yield (names[0] if names else f"line{node.lineno}"), node.value.value


def main() -> int:
    out_dir, files = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
    for path in files:
        for name, source in embedded_sources(path):
            target = out_dir / f"{'_'.join(path.with_suffix('').parts)}.{name}.cu"
            target.write_text(source, encoding="utf-8")
            print(f"{target}\t{path}:{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
