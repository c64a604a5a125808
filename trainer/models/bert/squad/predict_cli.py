"""``predict``: answer questions with a fine-tuned BERT QA model (checkpoint or HF BertForQuestionAnswering).

    predict --load ckpt/squad --input "Berlin is the capital of Germany. - What is the capital of Germany?"
    predict --load bert-squad-hf/ --input-file questions.json --json

Prints text, score, start and end (characters of the context) of each answer, one list per question.
"""

from __future__ import annotations

import json

from indexed_dataset.cli_parser import CommandParser, int_at_least
from indexed_dataset.cli_support import run_command
from trainer.models.bert.squad.cli import add_feature_arguments, feature_options, model_positions
from trainer.models.bert.squad.examples import parse_predict_inputs, read_predict_file
from trainer.models.bert.squad.finetune import PredictConfig, predict


def build_parser() -> CommandParser:
    parser = CommandParser(prog="predict", description="Answer questions with a fine-tuned BERT QA model.")
    parser.add_argument("--load", required=True, help="fine-tuned checkpoint or HF BertForQuestionAnswering directory")
    inputs = parser.add_mutually_exclusive_group(required=True)
    inputs.add_argument("--input", action="append", help='"context - question" (repeatable)')
    inputs.add_argument("--input-file", help='JSON list of {"context": ..., "question": ...}')
    parser.add_argument("--top-k", type=int_at_least(1), default=1, help="answers per question")
    parser.add_argument("--json", action="store_true", help="print one JSON object: id -> answers")
    add_feature_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``predict``; returns the exit code."""
    args = build_parser().parse_args(argv)

    def command() -> int:
        examples = parse_predict_inputs(args.input) if args.input else read_predict_file(args.input_file)
        config = PredictConfig(load=args.load, vocab_file=args.vocab_file, lower_case=args.lower_case,
                               features=feature_options(args, model_positions(args.load)), n_best_size=args.n_best_size,
                               max_answer_length=args.max_answer_length, top_k=args.top_k, device=args.device)
        answers = predict(config, examples)
        if args.json:
            print(json.dumps(answers, ensure_ascii=False))
        else:
            for example in examples:
                rounded = [{**a, "score": round(a["score"], 4)} for a in answers[example.id]]
                print(rounded)
        return 0

    return run_command("predict", command)


if __name__ == "__main__":
    raise SystemExit(main())
