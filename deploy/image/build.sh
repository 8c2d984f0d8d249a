#!/usr/bin/env bash
# Builds the Statusgate OCI image (make image). With a Docker engine: docker build. Without
# one (the development and CI machines): buildah, chroot isolation, vfs storage, so it runs
# inside an unprivileged container too. The base is python:3.11-slim when it can be pulled;
# where no registry is reachable, a Debian 12 base made here from Debian's own packages
# (debootstrap: python3, python3-venv, ca-certificates), built once and kept in buildah's
# storage as localhost/statusgate-base:bookworm.
#
#   deploy/image/build.sh IMAGE VERSION       e.g. registry.example.com/statusgate 0.2.0
#   BASE=...  use this base image instead (pulled or already in the local storage)
set -euo pipefail
cd "$(dirname "$0")/../.."

image=${1:?usage: build.sh IMAGE VERSION}
version=${2:?usage: build.sh IMAGE VERSION}
tag="$image:$version"
python=${PYTHON:-python3}

# The wheels the image installs, fetched here (the build runs with no network of its own):
# the locked runtime dependencies, and the gateway's own wheel.
rm -rf build/image && mkdir -p build/image/deps build/image/app
"$python" -m pip download --quiet --no-deps --only-binary=:all: -d build/image/deps \
  -r requirements.lock
"$python" -m pip wheel --quiet --no-deps -w build/image/app .

if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  exec docker build --build-arg "VERSION=$version" ${BASE:+--build-arg "BASE=$BASE"} -t "$tag" .
fi
if ! command -v buildah >/dev/null; then
  echo "make image: neither a Docker engine nor buildah is available." >&2
  echo "Install buildah (Debian: apt-get install buildah debootstrap) or run a Docker engine." >&2
  exit 1
fi
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot

debian_base() {
  local name=localhost/statusgate-base:bookworm
  if buildah inspect --type image "$name" >/dev/null 2>&1; then
    echo "$name"
    return
  fi
  if ! command -v debootstrap >/dev/null; then
    echo "make image: python:3.11-slim cannot be pulled and debootstrap is missing" >&2
    echo "(Debian: apt-get install debootstrap) to make a base from Debian's packages." >&2
    exit 1
  fi
  local root
  root=$(mktemp -d)
  trap 'rm -rf "$root"' RETURN
  echo "Making $name from Debian's packages (debootstrap, about a minute)..." >&2
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >&2
  rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc \
    "$root"/usr/share/man "$root"/usr/share/info
  local container
  container=$(buildah from scratch)
  buildah copy --quiet "$container" "$root"/ / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd /bin/sh "$container"
  buildah commit --quiet --rm "$container" "$name" >/dev/null
  echo "$name"
}

base=${BASE:-}
if [[ -z "$base" ]]; then
  if buildah pull --quiet docker.io/library/python:3.11-slim >/dev/null 2>&1; then
    base=docker.io/library/python:3.11-slim
  else
    echo "make image: python:3.11-slim cannot be pulled; using a Debian 12 base made here" >&2
    base=$(debian_base)
  fi
fi
buildah bud --layers --build-arg "VERSION=$version" --build-arg "BASE=$base" -t "$tag" .
echo "Built $tag on $base"
