#!/usr/bin/env bash
# Run the history tests against a real PostgreSQL server: install the distribution's package if
# missing, make a throwaway cluster in a temporary folder, start it on a loopback port, export
# DCP_HARNESS_TEST_POSTGRES (the tests then must reach it, or fail), run the tests, stop the
# server and remove the folder. Needs root (apt-get; the server runs as the postgres user).
# Uses the active Python (the venv .ci/run made), or $PYTHON; extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
PORT="${DCP_PG_PORT:-55432}"

if [ "$(id -u)" != 0 ]; then
    echo "error: .ci/postgres.sh needs root (it installs and starts PostgreSQL)" >&2
    exit 2
fi
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
BIN="$(dirname "$(ls -d /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")"
DATA="$(mktemp -d)"
chown postgres "$DATA"
stop_server() {
    su postgres -c "$BIN/pg_ctl -D $DATA stop -m fast" >/dev/null 2>&1 || true
    rm -rf "$DATA"
}
trap stop_server EXIT
su postgres -c "$BIN/initdb -D $DATA -A trust -U postgres" >/dev/null
su postgres -c "$BIN/pg_ctl -D $DATA -o '-p $PORT -k $DATA -c listen_addresses=127.0.0.1' -l $DATA/log start -w" >/dev/null
export DCP_HARNESS_TEST_POSTGRES="postgresql+psycopg://postgres@127.0.0.1:$PORT/postgres"
echo "PostgreSQL on 127.0.0.1:$PORT ($("$BIN/postgres" --version))"
"$PYTHON" -m pytest tests/history -q -p no:cacheprovider "$@"
