"""`bench warmstart`: build the warm-started tiny policy (supervised fine-tuning on `arith`), then measure it.

The result is an ordinary Hugging Face model folder usable as `--model DIR`. With the default recipe (seed 0,
500 steps, difficulty 2) it reproduces the shipped `builtin:tiny-arith` checkpoint. A folder that already holds the
same recipe is reused unless `--force`; one holding another recipe's model is refused unless `--force`.
"""

from __future__ import annotations

import argparse

from bench import faults
from bench.cli.interrupt import Stopped, rerun, rerun_command
from bench.inputs import check_seed
from bench.model import load_policy
from bench.warmstart import Recipe, held_out_accuracy, warmstart


def register(sub: argparse._SubParsersAction) -> None:
    d = Recipe()
    p = sub.add_parser("warmstart", help="build the warm-started tiny policy", description=__doc__)
    p.add_argument("--out", help="output folder (default .pobench/models/tiny-arith-d<D>-s<SEED>-n<STEPS>)")
    p.add_argument("--steps", type=int, default=d.steps, help=f"optimizer steps (default {d.steps})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed of initialisation and data (default {d.seed})")
    p.add_argument("--difficulty", type=int, default=d.difficulty,
                   help=f"arith difficulty trained on (default {d.difficulty})")
    p.add_argument("--force", action="store_true", help="retrain even if the folder already holds this recipe; "
                   "replace the model of another recipe held there")
    p.add_argument("--eval", type=int, default=400, metavar="N",
                   help="measure greedy and sampled accuracy on N held-out problems afterwards (0 = skip)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    recipe = Recipe(steps=args.steps, seed=check_seed(args.seed, "--seed"), difficulty=args.difficulty)
    recipe.validate()
    if args.eval < 0:
        raise ValueError(f"--eval {args.eval}: must be >= 0")
    out = args.out or f".pobench/models/tiny-arith-d{recipe.difficulty}-s{recipe.seed}-n{recipe.steps}"
    if args.out:  # a file in its place, a read-only folder: refused now as every --out is (held-out round 11, H16)
        faults.check_output_folder(args.out, "--out")
    try:
        path = warmstart(out, recipe, force=args.force, progress=not args.no_progress)
    except KeyboardInterrupt:  # (the model is saved once trained)
        raise Stopped("nothing: the model is saved once its training ends", rerun()) from None
    print(f"warm-started model: {path}")
    if args.eval:
        try:
            model, tok = load_policy(str(path))
            greedy = held_out_accuracy(model, tok, difficulty=recipe.difficulty, problems=args.eval, temperature=0)
            sampled = held_out_accuracy(model, tok, difficulty=recipe.difficulty, problems=args.eval,
                                        temperature=1.0)
        except KeyboardInterrupt:  # the same command reuses the saved model and measures it
            raise Stopped(f"the warm-started model in {path}", f"measure it by rerunning the same command (the "
                          f"model is reused): {rerun_command()}") from None
        print(f"held-out accuracy on {args.eval} arith problems (difficulty {recipe.difficulty}): "
              f"greedy {greedy:.1%}, sampled (T=1) {sampled:.1%}")
    return 0
