#!/bin/bash
# (device recipe for the NCCL backend, kept for the multi-GPU session: run from a copy in an ignored .gpu3/ folder; it packs ../build binaries, ../.gpu/lib libraries and a relocatable Open MPI)
# local: pack binaries, libraries and a relocatable Open MPI for the device (.gpu3/pkg.tar.xz)
set -e
cd "$(dirname "$0")"; rm -rf stage; mkdir -p stage/bin stage/lib stage/root/usr/bin stage/root/usr/lib/x86_64-linux-gnu stage/root/usr/share
B=../build
cp $B/moe $B/test_nccl $B/ckpt_diff stage/bin/
cp ../.gpu/lib/* stage/lib/
cp -L /usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so.2 /lib/x86_64-linux-gnu/libnuma.so.1 stage/lib/
cp -L /usr/bin/orterun stage/root/usr/bin/mpirun; cp -L /usr/bin/orted stage/root/usr/bin/
cp -a /usr/lib/x86_64-linux-gnu/openmpi stage/root/usr/lib/x86_64-linux-gnu/
rm -rf stage/root/usr/lib/x86_64-linux-gnu/openmpi/include stage/root/usr/lib/x86_64-linux-gnu/openmpi/lib/*java* 
cp -a /usr/lib/x86_64-linux-gnu/pmix2 stage/root/usr/lib/x86_64-linux-gnu/
rm -rf stage/root/usr/lib/x86_64-linux-gnu/pmix2/include stage/root/usr/lib/x86_64-linux-gnu/pmix2/lib/*.a
cd stage/root/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
for f in *.so; do ldd $f | grep -qE "libucp|libuct|libfabric|libpsm|libibverbs|librdmacm|liboshmem" && rm -f $f; done
cd - >/dev/null
cp -a /usr/share/openmpi stage/root/usr/share/; [ -d /usr/share/pmix ] && cp -a /usr/share/pmix stage/root/usr/share/ || true
cp -a /usr/lib/x86_64-linux-gnu/pmix2/share/pmix stage/root/usr/share/ 2>/dev/null || true
tar -C stage -cJf pkg.tar.xz . && rm -rf stage
ls -la pkg.tar.xz
