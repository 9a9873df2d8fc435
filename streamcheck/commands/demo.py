"""`streamcheck demo`: the implicit-join pattern in ten device calls, and what the checker says.

The matmul (stream A) and the RMS (stream B) run in parallel; the post-scale on
the legacy default stream waits for B but not for A. With non-blocking streams
the legacy stream does not join A implicitly, so the post-scale may read Y before
the matmul wrote it. The checker reports it from the trace alone, whatever the
schedule; the `delay` schedule, whose seed picks the streams it holds back, makes it
strike when it holds stream A (seed 0 does).
"""
from __future__ import annotations

import json
import sys
from contextlib import redirect_stdout

import numpy as np

from . import STDOUT, output_problem, report_width


def implicit_join_demo(policy: str = "delay", wait_for_matmul: bool = False, seed: int = 0):
    from ..device import Device

    # No streams named: the seed picks which ones the delay holds (schedule.seed_delays).
    dev = Device("sim", policy=policy, seed=seed, **({"steps": 6} if policy == "delay" else {}))
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc((1, 8), "float32", name="x", fill=1.0)
    w = dev.alloc((8, 8), "float32", name="W*", fill=0.5)
    y = dev.alloc((1, 8), "float32", name="Y", fill=0.0)  # persistent: holds the previous step's value
    r = dev.alloc((1, 1), "float32", name="r", fill=0.0)
    out = dev.alloc((1, 8), "float32", name="out", fill=0.0)

    def matmul(x, w, y):
        np.matmul(x, w.T, out=y)

    def rms(x, r):
        r[:, 0] = 1.0 / np.sqrt(np.mean(x * x, axis=1) + 1e-6)

    def postscale(y, r, out):
        np.multiply(y, r, out=out)

    fork = dev.legacy.record()
    a.wait_event(fork)
    b.wait_event(fork)
    dev.launch(matmul, (x, w, y), stream=a, reads=[x, w], writes=[y])
    dev.launch(rms, (x, r), stream=b, reads=[x], writes=[r])
    dev.legacy.wait_event(b.record())
    if wait_for_matmul:
        dev.legacy.wait_event(a.record())
    dev.launch(postscale, (y, r, out), stream=dev.legacy, reads=[y, r], writes=[out])
    return dev, dev.get(out)


def run(args) -> int:
    problem = output_problem("--json", args.json, "demo.json")
    if problem:
        print(f"streamcheck demo: {problem}", file=sys.stderr)
        return 2
    if args.json == STDOUT:  # `--json -`: stdout holds the JSON alone, the text goes to stderr
        json_out = sys.stdout
        with redirect_stdout(sys.stderr):
            return _demo(args, json_out)
    return _demo(args)


def _demo(args, json_out=None) -> int:
    dev, value = implicit_join_demo(seed=args.seed)
    fixed_dev, fixed = implicit_join_demo(wait_for_matmul=True, seed=args.seed)
    print("implicit join (post-scale waits for the RMS stream only), schedule:", dev.schedule)
    struck = not np.array_equal(value, fixed)
    print(f"  out = {value[0, :4]} ...   expected {fixed[0, :4]} ..."
          + ("" if struck else "   (this seed's delay did not strike; the race is reported all the same)"))
    print()
    print(dev.report(width=report_width(sys.stdout)))
    print()
    fixed_report = fixed_dev.report(width=report_width(sys.stdout))
    print(f"with the matmul joined too: out = {fixed[0, :4]} ...; {fixed_report}")
    if args.json:
        from ..atomic_files import write_text
        from ..core.hb import reports_to_dicts

        # The keys as repro's --json names them: what ran, whether it struck, each run's reports.
        report = {"demo": "implicit-join", "seed": args.seed, "schedule": str(dev.schedule), "struck": struck,
                  "out": value[0].tolist(), "expected": fixed[0].tolist(),
                  "implicit_join": {"races": reports_to_dicts(dev.races)},
                  "fixed": {"races": reports_to_dicts(fixed_dev.races)}}
        text = json.dumps(report, indent=2) + "\n"
        if json_out is not None:
            json_out.write(text)
        else:
            try:
                write_text(args.json, text)  # whole or absent (atomic_files)
            except OSError as exc:
                print(f"streamcheck demo: could not write {args.json}: {exc.strerror or exc}", file=sys.stderr)
                return 2
            print(f"JSON report: {args.json}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="record the implicit-join pattern and print the checker's report",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the sim's delay schedule: it picks which streams are held back (default 0, "
                        "which holds stream A, so the stale read strikes); the schedule line shows it for replay")
    p.add_argument("--json", metavar="FILE",
                   help="also write the outcome as JSON to FILE (- for stdout, the text then on stderr): the "
                        "schedule, the values, both runs' race reports")
    p.set_defaults(func=run)
