"""``callbox eval``: tasks run by the agent loop, each in its own sandbox, scored by their
acceptance checks.

The parts, each with one job: :mod:`harness.eval.tasks` (the task file), :mod:`harness.eval.scoring`
(a trial's result, pass@k), :mod:`harness.eval.results` (the out directory: results kept as
they finish, so a resumed eval runs nothing twice), :mod:`harness.eval.runner` (the trials,
N at a time, from the warm pool or on the Ray cluster), :mod:`harness.eval.progress` (the
progress bar) and :mod:`harness.eval.report` (the terminal table, the JSON file, the HTML
report). The eval sits beside the doors and the CLI: it drives the loop and reads the audit
store; nothing below it imports it.
"""
