"""Time the hopper backend's forward and backward with each score function on suite workloads' shapes (bf16, an
sm_90 GPU): what an activation costs against softmax at the same shape, kernel by kernel.

    python benchmarks/activations.py [--only NAME,...] [--activations softmax,silu,...] [--rep-ms 100]

One line per workload and score function: the forward and the whole backward (jfa.hopper.backward, the caller's
bounds given), median ms of triton.testing.do_bench.
"""
import argparse
import dataclasses

import torch
from triton.testing import do_bench

from jfa import hopper
from jfa.bench import suite
from jfa.variants import SCORE_NAMES


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="gdpa-self,gdpa-cross-short-kv,hstu-silu")
    p.add_argument("--activations", default=",".join(SCORE_NAMES))
    p.add_argument("--rep-ms", type=int, default=100)
    args = p.parse_args(argv)
    _, workloads = suite.load_suite()
    for w in suite.select(workloads, args.only):
        for act in args.activations.split(","):
            wa = dataclasses.replace(w, activation=act, out_scale=1.0 if act == "softmax" else w.out_scale or 1.0)
            inp = suite.make_inputs(wa, device="cuda", dtype=torch.bfloat16)
            prob = inp.problem("hopper")
            out, lse = hopper.forward(prob)
            fwd = do_bench(lambda: hopper.forward(prob), warmup=25, rep=args.rep_ms, return_mode="median")
            bwd = do_bench(lambda: hopper.backward(prob, out, lse, inp.dout, None), warmup=25, rep=args.rep_ms,
                           return_mode="median")
            print(f"{w.name:<22} {act:<10} forward {fwd:7.3f} ms  backward {bwd:7.3f} ms", flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
