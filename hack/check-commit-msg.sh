#!/usr/bin/env bash
# Commit message rule (docs/development.md "Commits"): a subject of at most 72 characters, and
# when there is a body, a blank line between them. Used as the pre-commit `commit-msg` hook
# (.pre-commit-config.yaml) with the message file as $1; test/hack/test_commit_subjects.py applies
# the same rule to every commit since the rule was made.
set -euo pipefail
file=${1:?usage: hack/check-commit-msg.sh <commit message file>}
# git's own comment lines (the editor template) are not part of the message.
mapfile -t lines < <(grep -v '^#' "$file")
subject=${lines[0]:-}
if [[ -z "$subject" ]]; then
  echo "commit message: the subject (first line) is empty" >&2
  exit 1
fi
if (( ${#subject} > 72 )); then
  echo "commit message: the subject has ${#subject} characters; at most 72 (details go in the body)" >&2
  exit 1
fi
if (( ${#lines[@]} > 1 )) && [[ -n "${lines[1]}" ]]; then
  echo "commit message: leave the second line empty between the subject and the body" >&2
  exit 1
fi
