"""`hf-msv`: a thin command line over the library. Each sub-command calls one public function."""

from __future__ import annotations

import argparse
import sys


def _demo(args):
    from .demo import load_custom, run_demo

    model = tokenizer = verifier = None
    if args.model or args.verifier:
        if not (args.model and args.verifier):
            sys.exit("--model and --verifier go together (the verifier must match the LM).")
        model, tokenizer, verifier = load_custom(args.model, args.verifier, args.gguf_file, args.device)
    threshold = {} if args.threshold is None else {"threshold": args.threshold}
    run_demo(num_problems=args.problems, question=args.question, num_sequences=args.num_sequences,
             max_new_tokens=args.max_new_tokens, seed=args.seed, model=model,
             tokenizer=tokenizer, verifier=verifier, output_dir=args.output_dir, device=args.device,
             **threshold)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-msv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="N parallel samples per problem, MSV selection and early stopping")
    demo.add_argument("--problems", type=int, default=12, help="testbed evaluation problems to run")
    demo.add_argument("--question", help="your own question instead (no gold answer, so no grading)")
    demo.add_argument("-n", "--num-sequences", type=int, default=16)
    demo.add_argument("--threshold", type=float, default=None,
                      help="λ: stop once the best answer's score reaches it (default: the testbed's, chosen on "
                           "validation)")
    demo.add_argument("--max-new-tokens", type=int, default=400)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--model", help="a local or Hub causal LM instead of the embedded testbed LM")
    demo.add_argument("--gguf-file", help="GGUF file inside --model, if it is a GGUF repo")
    demo.add_argument("--verifier", help="a local or Hub MSV verifier trained for --model")
    demo.add_argument("--output-dir", default="outputs/demo")
    demo.add_argument("--device", default="auto", help="auto (default): the GPU when there is one, else the CPU")
    demo.set_defaults(func=_demo)

    from .collect import add_collect_arguments, collect_from_args
    from .training import add_train_arguments, train_from_args

    collect = sub.add_parser("collect", help="sample N answers per problem and write hidden-state shards")
    add_collect_arguments(collect).set_defaults(func=collect_from_args)
    train = sub.add_parser("train", help="train an MSV_N or a probe on collected shards")
    add_train_arguments(train).set_defaults(func=train_from_args)

    from .evaluation import add_evaluate_arguments, evaluate_from_args
    from .reproduction import add_reproduce_arguments, reproduce_from_args

    evaluate = sub.add_parser("evaluate", help="baselines, metrics, figures and λ rules over collected shards")
    add_evaluate_arguments(evaluate).set_defaults(func=evaluate_from_args)
    reproduce = sub.add_parser("reproduce", help="the paper's experiments on the testbed (--quick: ~10 min)")
    add_reproduce_arguments(reproduce).set_defaults(func=reproduce_from_args)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
