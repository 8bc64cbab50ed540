#!/usr/bin/env bash
# Prints, one per line, the Debian packages that provide the shared libraries BINARY links
# against: what a runtime image must `apt-get install` to run a binary built in the build image.
# Fails, naming the library, if a library belongs to no package (a library built by hand would
# be missing from the runtime image).
# Usage: deploy/docker/runtime-packages.sh BINARY
set -euo pipefail
binary=${1:?usage: runtime-packages.sh BINARY}
[ -x "$binary" ] || { echo "runtime-packages: $binary is not an executable" >&2; exit 1; }

libs=$(ldd "$binary" | awk '/=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}')
if ldd "$binary" | grep -q "not found"; then
  echo "runtime-packages: $binary has unresolved libraries:" >&2
  ldd "$binary" | grep "not found" >&2
  exit 1
fi

owner() {  # the package owning a path, trying the path as linked and as installed (usrmerge)
  local path=$1 real
  real=$(readlink -f "$path")
  for candidate in "$path" "$real" "/usr$path" "${real#/usr}"; do
    if out=$(dpkg-query -S "$candidate" 2>/dev/null); then
      echo "${out%%:*}"
      return 0
    fi
  done
  return 1
}

packages=()
for lib in $libs; do
  if ! pkg=$(owner "$lib"); then
    echo "runtime-packages: no Debian package provides $lib" >&2
    exit 1
  fi
  packages+=("${pkg%%,*}")
done
printf '%s\n' "${packages[@]}" | sort -u
