"""What several test modules share: builders, fixtures, fakes and helpers.

Test modules import from here and never from each other (tests/ is on ``sys.path``, as
pytest's default import mode puts it there, so this package is ``support``):

- ``services``: the service-availability rule (skip, or fail under CI=true);
- ``processes``: free ports, gone pids and process groups, the sim servers a test started;
- ``studies``: a study config builder (``config(**over)``) on a small sim-virtual study;
- ``databases``: fresh SQLite/PostgreSQL databases and store records for the store contract;
- ``runners``: fake ``Runner``s (autotune/tuning/measure/runner_protocol.py): a scripted one
  that drives ``run_trial`` through every branch, and one with known noise for the validation phase;
- ``fake_server``: a small misbehaving OpenAI-compatible server for the load generator;
- ``prometheus``: a real Prometheus on a free port;
- ``nightly``: trace files and nightly configs; ``ledger`` and ``pgcluster``: the fault suite;
  ``chromium``: headless rendering of the HTML report; ``bad_inputs``: the bad-input catalogue.
"""
