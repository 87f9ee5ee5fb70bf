"""Where `launch` and `evaluate` of `dpot-train` were declared, kept importable: the commands now live in
dpot_train/cli/ (launch.py, evaluate.py, options.py), their work in dpot_train.launch_request and eval_run."""

from dpot_train.cli.evaluate import evaluate_cmd  # noqa: F401
from dpot_train.cli.launch import launch_cmd  # noqa: F401
from dpot_train.cli.options import (CACHE_DIR_HELP, CACHE_LIMIT_HELP, SHA256_HELP, TRACKER_HELP,  # noqa: F401
                                    TRACKER_PROJECT_HELP, VERIFY_HELP)
from dpot_train.eval_run import check_out_file  # noqa: F401
from dpot_train.launch_request import (_DERIVED, _SWITCHES, _VALUES, VERIFY_MODES, launch_overrides,  # noqa: F401
                                       res_option, verify_overrides)
