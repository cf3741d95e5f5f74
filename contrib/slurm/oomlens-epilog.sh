#!/bin/bash
# oomlens SLURM Epilog: analyze a failed job's crash on its node, the moment it ends.
#
#   slurm.conf:  Epilog=/etc/slurm/oomlens-epilog.sh      (and/or EpilogSlurmctld=)
#                PrologEpilogTimeout=60                   (more than HARD_LIMIT below)
#
# slurmd drains the node when an Epilog exits non-zero or outlives PrologEpilogTimeout, so
# this script ALWAYS exits 0 and kills oomlens after HARD_LIMIT seconds; oomlens itself stops
# its analysis at its own budget (budget_seconds in the settings file), 2 s before that.
# It calls no Slurm command.  slurmd gives an Epilog no PATH: every program is named here.
#
# Edit these three lines for your site (or export the OOMLENS_EPILOG_* variables):
OOMLENS="${OOMLENS_EPILOG_BIN:-/opt/oomlens/bin/oomlens}"     # the console script in a venv
SETTINGS="${OOMLENS_EPILOG_SETTINGS:-/etc/oomlens/epilog.toml}"
HARD_LIMIT="${OOMLENS_EPILOG_HARD_LIMIT:-30}"                  # seconds; < PrologEpilogTimeout

PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
set +e
child=""
# A TERM from slurmd (PrologEpilogTimeout) ends oomlens and this script at once, with status 0.
trap '[ -n "$child" ] && kill -KILL -- "-$child" 2>/dev/null; exit 0' TERM INT HUP

args=(epilog --settings "$SETTINGS" --hard-limit "$HARD_LIMIT")
if [ -n "${OOMLENS_EPILOG_SPOOL:-}" ]; then
    args+=(--spool "$OOMLENS_EPILOG_SPOOL")
fi

if [ -x "$OOMLENS" ] && [ -x /usr/bin/timeout ]; then
    # In the background, so that a TERM runs the trap at once instead of after the foreground
    # command.  timeout leads its own process group and SIGKILLs all of it at the limit.
    /usr/bin/timeout --signal=KILL "$HARD_LIMIT" "$OOMLENS" "${args[@]}" \
        </dev/null >/dev/null 2>&1 &
    child=$!
    wait "$child" 2>/dev/null
fi
exit 0
