#!/bin/bash
# mesh_pack.sh DIR — for the mesh recipes on the lent GPU machine (gpu_mesh.sh, share_bench.sh): packs
# build/'s programs and the shared libraries the device image lacks (scripts/device/pack_common.sh's lists)
# and a relocatable Open MPI (mpirun, orted, its components, PMIx; the same version the binaries
# link) into DIR/pkg.tar.xz (about 15 MB). DIR must be ignored by git (.git/info/exclude) and named in the
# device call's carry.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${1:?usage: scripts/device/mesh_pack.sh DIR}
S=$(mktemp -d)
trap 'rm -rf "$S"' EXIT
mkdir -p "$S/bin" "$S/lib" "$S/root/usr/bin" "$S/root/usr/lib/x86_64-linux-gnu" "$S/root/usr/share"
. scripts/device/pack_common.sh
copy_programs "$S/bin"
copy_libs "$S/lib"
L=/usr/lib/x86_64-linux-gnu
cp -L $L/pmix2/lib/libpmix.so.2 /lib/x86_64-linux-gnu/libnuma.so.1 "$S/lib/"
cp -L /usr/bin/orterun "$S/root/usr/bin/mpirun"
cp -L /usr/bin/orted "$S/root/usr/bin/"
cp -a $L/openmpi $L/pmix2 "$S/root/usr/lib/x86_64-linux-gnu/"
rm -rf "$S/root/usr/lib/x86_64-linux-gnu/openmpi/include" "$S/root/usr/lib/x86_64-linux-gnu/pmix2/include" \
  "$S"/root/usr/lib/x86_64-linux-gnu/openmpi/lib/*java* "$S"/root/usr/lib/x86_64-linux-gnu/pmix2/lib/*.a
# components that need network stacks the device lacks (UCX, libfabric, verbs) would only print load errors
for f in "$S"/root/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so; do
  ldd "$f" | grep -qE "libucp|libuct|libfabric|libpsm|libibverbs|librdmacm|liboshmem" && rm -f "$f"
done
cp -a /usr/share/openmpi "$S/root/usr/share/"
[ -d /usr/share/pmix ] && cp -a /usr/share/pmix "$S/root/usr/share/"
[ -d $L/pmix2/share/pmix ] && cp -a $L/pmix2/share/pmix "$S/root/usr/share/"
mkdir -p "$D"
tar -C "$S" -cJf "$D/pkg.tar.xz" .
ls -la "$D/pkg.tar.xz"
