"""``python -m bench.engines.trl --config run.yaml``: one TRL-engine run (see ``run.main``)."""

import sys

from bench.engines.trl.run import main

sys.exit(main())
