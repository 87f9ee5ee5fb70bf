"""Where `launch` and `evaluate` of `dpot-train` were declared, kept importable: the commands now live in
dpot_train/cli/ (launch.py, evaluate.py, options.py), their work in dpot_train.run.launch_request and eval_run."""

from dpot_train.cli.evaluate import evaluate_cmd
from dpot_train.cli.launch import launch_cmd
from dpot_train.cli.options import (CACHE_DIR_HELP, CACHE_LIMIT_HELP, SHA256_HELP, TRACKER_HELP,
                                    TRACKER_PROJECT_HELP, VERIFY_HELP)
from dpot_train.run.eval_run import check_out_file
from dpot_train.run.launch_request import (_DERIVED, _SWITCHES, _VALUES, VERIFY_MODES, launch_overrides, res_option,
                                           verify_overrides)

__all__ = ["CACHE_DIR_HELP", "CACHE_LIMIT_HELP", "SHA256_HELP", "TRACKER_HELP", "TRACKER_PROJECT_HELP", "VERIFY_HELP",
           "VERIFY_MODES", "_DERIVED", "_SWITCHES", "_VALUES", "check_out_file", "evaluate_cmd", "launch_cmd",
           "launch_overrides", "res_option", "verify_overrides"]
