#!/bin/sh
# Fetches a Linux kernel to boot the appliance image under QEMU (tests/image/boot_test.sh):
# Debian's current linux-image-amd64 kernel package, downloaded with `apt-get download` (no
# install, no root), of which only boot/vmlinuz-* is kept, as DIR/vmlinuz, and the modules a
# checkpoint on a virtio disk with ext4 needs, as DIR/modules/*.ko (DIR/modules/order lists them
# in the order they load: each after what it depends on). Debian's kernel has all the image
# itself needs built in (initramfs, devtmpfs, tmpfs, the 8250 serial console, ACPI power-off).
# Usage: tools/fetch_kernel.sh DIR
set -e
dir=$1
[ -n "$dir" ] || { echo "usage: tools/fetch_kernel.sh DIR" >&2; exit 2; }
[ -s "$dir/vmlinuz" ] && [ -s "$dir/modules/order" ] && exit 0
command -v apt-get >/dev/null || { echo "apt-get not found: set DSV32_KERNEL to a kernel image" >&2; exit 1; }
# the metapackage names the versioned package that holds the kernel
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)/\1/p' | head -n 1)
[ -n "$pkg" ] || { echo "no linux-image-amd64 in the package lists (apt-get update?)" >&2; exit 1; }
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download "$pkg" >/dev/null 2>&1) || { echo "apt-get download $pkg failed" >&2; exit 1; }
# (crc32c_generic: ext4's metadata checksums ask the crypto API for crc32c when mounting)
mods="drivers/virtio/virtio drivers/virtio/virtio_ring drivers/virtio/virtio_pci_legacy_dev
  drivers/virtio/virtio_pci_modern_dev drivers/virtio/virtio_pci drivers/block/virtio_blk
  lib/crc16 fs/mbcache fs/jbd2/jbd2 crypto/crc32c_generic fs/ext4/ext4"
pats=
for m in $mods; do pats="$pats ./lib/modules/*/kernel/$m.ko"; done
# shellcheck disable=SC2086
dpkg-deb --fsys-tarfile "$tmp"/*.deb | tar -x -C "$tmp" --wildcards './boot/vmlinuz-*' $pats
mkdir -p "$dir/modules"
for m in $mods; do cp "$tmp"/lib/modules/*/kernel/$m.ko "$dir/modules/"; done
# the load order: each module after those its modinfo "depends=" names (which must be here)
: > "$dir/modules/order.tmp"
left=$(for m in $mods; do basename "$m"; done)
while [ -n "$left" ]; do
  next=
  for m in $left; do
    deps=$(grep -a -o 'depends=[a-z0-9_,-]*' "$dir/modules/$m.ko" | head -n 1 | cut -d= -f2 | tr , ' ' | tr - _)
    ok=1
    for d in $deps; do grep -qx "$d.ko" "$dir/modules/order.tmp" || ok=0; done
    if [ $ok = 1 ]; then echo "$m.ko" >> "$dir/modules/order.tmp"; else next="$next $m"; fi
  done
  [ "$(echo $next)" = "$(echo $left)" ] && { echo "modules with dependencies not fetched:$next" >&2; exit 1; }
  left=$(echo $next)
done
mv "$dir/modules/order.tmp" "$dir/modules/order"
cp "$tmp"/boot/vmlinuz-* "$dir/vmlinuz.tmp"
mv "$dir/vmlinuz.tmp" "$dir/vmlinuz"
echo "kernel: $pkg -> $dir/vmlinuz"
