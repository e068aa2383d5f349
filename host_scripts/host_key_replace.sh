#!/bin/sh
# Puts a new Ed25519 SSH host key in place of the one the host was given at creation, and makes
# sshd present it. The first key came in the server's cloud-init user data, which Hetzner's
# metadata service serves to anything on the server for its whole life (a hostNetwork pod, any
# local user): once the program has logged in pinned to it, that key is replaced by one that
# never passed through the metadata service, so what user_data holds is worthless.
#
#   host_key_replace.sh PUBLIC_LINE   the private key was uploaded to $new (0600) beforehand
#
# Every other host key is removed (cloud-init was told to make none: ssh_genkeytypes []), so
# sshd offers this one alone. sshd is reloaded (SIGHUP: it re-executes itself and reads its keys
# again; connections already open, this one included, stay). Prints "replaced".
set -eu

key=/etc/ssh/ssh_host_ed25519_key
new="$key.hk3s-new"
public=${1:?usage: host_key_replace.sh PUBLIC_LINE}
if [ ! -s "$new" ]; then
  echo "no new host key at $new" >&2
  exit 1
fi
chmod 600 "$new"
printf '%s\n' "$public" > "$key.pub.hk3s-new"
chmod 644 "$key.pub.hk3s-new"
mv -f "$new" "$key"
mv -f "$key.pub.hk3s-new" "$key.pub"
for other in /etc/ssh/ssh_host_*_key; do
  [ "$other" = "$key" ] || rm -f "$other" "$other.pub"
done
sshd -t
if command -v systemctl >/dev/null 2>&1 && systemctl reload ssh 2>/dev/null; then
  :
elif command -v systemctl >/dev/null 2>&1 && systemctl reload sshd 2>/dev/null; then
  :
else
  echo "cannot reload sshd (systemctl reload ssh|sshd failed)" >&2
  exit 3
fi
echo replaced
