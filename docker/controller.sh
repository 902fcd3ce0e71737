#!/bin/sh
# The compose controller: bring the study database's schema up to date, then resume the
# study named in $AUTOTUNE_STUDY_CONFIG, or create and run it the first time.
set -eu
config=${AUTOTUNE_STUDY_CONFIG:?set AUTOTUNE_STUDY_CONFIG to a study YAML}
autotune db upgrade
# the interpreter autotune is installed in (a venv in the gpu image)
py="$(dirname "$(readlink -f "$(command -v autotune)")")/python"
name=$("$py" -c 'import sys; from autotune.config import load_config
print(load_config(sys.argv[1]).name)' "$config" 2>/dev/null || true)
if [ -n "$name" ]; then
    set +e
    autotune study run "$name" "$@"
    rc=$?
    set -e
    [ "$rc" -ne 4 ] && exit "$rc"  # 4: no such study yet
fi
exec autotune study create --config "$config" --run "$@"
