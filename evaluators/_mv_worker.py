"""Child process behind `evaluators.verify`: compares two LaTeX answers with math-verify, one JSON line per request.

It is started as a plain script (no package import) and killed by the parent when a comparison passes its deadline,
which is how the verifier's timeout works from any thread or process (math-verify's own timeout uses SIGALRM, which
only works in the main thread). Protocol: stdin ``{"gold": str, "pred": str}`` -> stdout ``{"ok": bool}``.
"""

import json
import logging
import os
import sys


def main() -> None:
    proto = os.fdopen(os.dup(1), "w")  # protocol channel; anything the libraries print goes to stderr instead
    os.dup2(2, 1)
    logging.disable(logging.CRITICAL)
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    proto.write('{"ready": true}\n')
    proto.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            gold = parse("\\boxed{" + request["gold"] + "}", extraction_config=config, parsing_timeout=None)
            pred = parse("\\boxed{" + request["pred"] + "}", extraction_config=config, parsing_timeout=None)
            ok = bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=None))
            reply = {"ok": ok}
        except Exception as e:  # a parse or sympy failure is a wrong answer, not a crash
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
        proto.write(json.dumps(reply) + "\n")
        proto.flush()


if __name__ == "__main__":
    main()
