"""``python -m autotune.store.migrations revision MESSAGE | check``: developer commands.

They live here rather than under ``python -m autotune.store.migrate`` because that module is
imported by ``autotune.store`` itself, which ``-m`` would then run a second time.
"""

from autotune.store.migrate import main

main()
