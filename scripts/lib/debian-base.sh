# Sourced by scripts/docker-system-test and scripts/package-test: the
# Debian base image both run on. No image can be pulled, so it is built
# from Debian packages with debootstrap (minbase, plus redis-server for the
# compose test's data servers, systemd for the package test's
# systemd-analyze, procps for the unit's /bin/kill (a dependency of the
# package, installed without network there), ca-certificates and curl) and
# `docker import`ed.
#
# debian_base_image sets BASE_IMAGE. It expects WORK (a scratch directory),
# ID (a unique suffix), CREATED_IMAGES (images to remove on exit), log and
# fail. Environment:
#   PICKET_BASE_IMAGE  an existing base image to use instead of building one
#                      (it is not removed)
#   PICKET_KEEP_BASE=1 keep the image this run builds, tagged
#                      picket-base:bookworm, for later runs

debian_mirror() {
  # The machine's own Debian mirror, from deb822 or one-line sources.
  local m=""
  if compgen -G '/etc/apt/sources.list.d/*.sources' >/dev/null; then
    m=$(awk '/^URIs:/ {print $2}' /etc/apt/sources.list.d/*.sources | grep -v security | grep /debian | head -1 || true)
  fi
  if [ -z "$m" ] && [ -f /etc/apt/sources.list ]; then
    m=$(awk '$1 == "deb" {print $2}' /etc/apt/sources.list | grep -v security | grep /debian | head -1 || true)
  fi
  echo "$m"
}

debian_base_image() {
  if [ -n "${PICKET_BASE_IMAGE:-}" ]; then
    BASE_IMAGE=$PICKET_BASE_IMAGE
    docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || fail "PICKET_BASE_IMAGE=$BASE_IMAGE does not exist"
    log "using the base image $BASE_IMAGE"
    return
  fi
  if [ "${PICKET_KEEP_BASE:-}" = 1 ]; then
    BASE_IMAGE=picket-base:bookworm
  else
    BASE_IMAGE=picket-base:systest-$ID
    CREATED_IMAGES+=("$BASE_IMAGE")
  fi
  [ "$(id -u)" = 0 ] || fail "building the base image needs root (debootstrap); or set PICKET_BASE_IMAGE"
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  fi
  log "building the base image $BASE_IMAGE from Debian packages (debootstrap)"
  local mirror
  mirror=$(debian_mirror)
  timeout 900 debootstrap --variant=minbase --include=redis-server,systemd,procps,ca-certificates,curl \
    bookworm "$WORK/rootfs" ${mirror:+"$mirror"} > "$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log" >&2; fail "debootstrap failed"; }
  tar -C "$WORK/rootfs" -c . | timeout 300 docker import - "$BASE_IMAGE" >/dev/null
  rm -rf "$WORK/rootfs"
}
