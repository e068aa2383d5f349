#!/usr/bin/env bash
# Adds or removes login keys in the login user's ~/.ssh/authorized_keys (a key rotation).
#
#   login_keys.sh add             adds the line in $NEW_KEY unless a line holds its key already
#   login_keys.sh remove          removes every line holding one of the keys in $RETIRE_KEYS
#                                 (one key line each), only while a line holds $NEW_KEY's key
#
# A key is matched by its base64 blob wherever it stands in a line (after options such as
# from="..."), so comments and options never matter. The file is rewritten as a whole: a
# temporary file beside it with the same mode, then a rename, so sshd never reads half a file.
# Prints "added", "present", "removed <n>" or "absent".
set -euo pipefail

action=${1:?usage: login_keys.sh add|remove}
dir="${HOME:?}/.ssh"
file="$dir/authorized_keys"
new_blob=$(printf '%s\n' "${NEW_KEY:?}" | awk '{print $2}')

holds_blob() { # file blob -> 0 when a line of file holds blob
  awk -v blob="$2" '{ for (i = 1; i <= NF; i++) if ($i == blob) found = 1 } END { exit found ? 0 : 1 }' "$1"
}

replace_file() { # temp -> file, keeping the mode (and the SELinux context where there is one)
  chmod --reference="$file" "$1"
  if ! mv -f "$1" "$file"; then
    rm -f "$1"
    echo "cannot replace $file (read-only or a mount point?)" >&2
    exit 4
  fi
  if command -v restorecon >/dev/null 2>&1; then restorecon "$file" || true; fi
}

case "$action" in
  add)
    if [ ! -d "$dir" ]; then
      mkdir -m 700 "$dir"
    fi
    if [ ! -e "$file" ]; then
      (umask 077 && : >"$file") || { echo "cannot create $file" >&2; exit 4; }
    fi
    if holds_blob "$file" "$new_blob"; then
      echo present
      exit 0
    fi
    temp=$(mktemp "$file.hk3s.XXXXXX") || { echo "cannot write in $dir" >&2; exit 4; }
    cat "$file" >"$temp"
    # A last line without its newline would run into the new one.
    if [ -s "$file" ] && [ -n "$(tail -c 1 "$file")" ]; then echo >>"$temp"; fi
    printf '%s\n' "$NEW_KEY" >>"$temp"
    replace_file "$temp"
    echo added
    ;;
  remove)
    retire=$(printf '%s\n' "${RETIRE_KEYS:?}" | awk 'NF >= 2 {print $2}' | tr '\n' ' ')
    if [ ! -e "$file" ] || ! holds_blob "$file" "$new_blob"; then
      echo "$file does not hold the new login key; nothing removed (the old key would be the only way in)" >&2
      exit 3
    fi
    count=$(awk -v retire="$retire" -v keep="$new_blob" '
      BEGIN { n = split(retire, blobs, " "); for (i = 1; i <= n; i++) if (blobs[i] != keep) drop[blobs[i]] = 1 }
      { for (i = 1; i <= NF; i++) if ($i in drop) { c++; next } }
      END { print c + 0 }' "$file")
    if [ "$count" -eq 0 ]; then
      echo absent
      exit 0
    fi
    temp=$(mktemp "$file.hk3s.XXXXXX") || { echo "cannot write in $dir" >&2; exit 4; }
    awk -v retire="$retire" -v keep="$new_blob" '
      BEGIN { n = split(retire, blobs, " "); for (i = 1; i <= n; i++) if (blobs[i] != keep) drop[blobs[i]] = 1 }
      { for (i = 1; i <= NF; i++) if ($i in drop) next; print }' "$file" >"$temp"
    replace_file "$temp"
    echo "removed $count"
    ;;
  *)
    echo "unknown action $action" >&2
    exit 2
    ;;
esac
