# What one compute node has, one fact a line (`KEY VALUE...`), for
# `hpcyolo site init` and `hpcyolo doctor` (hpcyolo/login/siteinit.py reads it).
# POSIX sh, run by srun on the node: it needs nothing of hpcyolo there.
# OTHER (argument 1): another node of the partition, to see which interface
# the kernel routes to it through.
other=${1:-}
echo "host $(hostname)"
v=$( (slurmd -V || srun --version || scontrol --version) 2>/dev/null | head -n 1)
[ -n "$v" ] && echo "slurm ${v##* }"
echo "cpus $(getconf _NPROCESSORS_ONLN 2>/dev/null || nproc)"
tpc=$(LC_ALL=C lscpu 2>/dev/null | sed -n 's/^Thread(s) per core: *//p')
[ -n "$tpc" ] && echo "threads_per_core $tpc"
echo "mem_kb $(sed -n 's/^MemTotal: *\([0-9]*\) kB/\1/p' /proc/meminfo)"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu /'
elif command -v rocm-smi >/dev/null 2>&1; then
    rocm-smi --showproductname --showmeminfo vram --csv 2>/dev/null | sed -n '2,$p' | \
        awk -F, '{ printf "gpu %s, %d MiB\n", $3, $NF / 1048576 }'
fi
for path in /sys/class/net/*; do
    name=${path##*/}
    case $(cat "$path/type" 2>/dev/null) in
        1) kind=ether ;; 32) kind=infiniband ;; 772) kind=loopback ;; *) kind=other ;;
    esac
    addr=$(ip -o -4 addr show dev "$name" 2>/dev/null | awk '{ print $4; exit }')
    echo "if $name $kind $(cat "$path/operstate" 2>/dev/null || echo unknown) ${addr:--}"
done
if [ -n "$other" ]; then
    to=$(getent hosts "$other" 2>/dev/null | awk '{ print $1; exit }')
    [ -n "$to" ] && ip -o route get "$to" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/route \1/p' | head -n 1
fi
for d in /sys/class/infiniband/*; do [ -e "$d" ] && echo "ib ${d##*/}"; done
for d in /sys/class/cxi/*; do [ -e "$d" ] && echo "cxi ${d##*/}"; done
for path in /dev/shm /tmp "${TMPDIR:-}" /local /localscratch /scratch_local /scratch/local /raid /nvme; do
    if [ -z "$path" ] || [ ! -d "$path" ]; then continue; fi
    df -Pk "$path" 2>/dev/null | awk -v p="$path" 'NR == 2 { print p, $2, $4 }' | while read -r p total free; do
        echo "df $p $total $free $(stat -f -c %T "$p" 2>/dev/null || echo unknown)"
    done
done
awk '$3 ~ /^(lustre|gpfs|beegfs|nfs|nfs4|cifs|wekafs|ceph|fuse.ceph|panfs)$/ { print "mount", $2, $3 }' /proc/mounts \
    2>/dev/null | sort -u
for name in SCRATCH PSCRATCH CSCRATCH WORK PROJECT FASTDATA LOCAL_SCRATCH TMPDIR; do
    eval "value=\${$name:-}"
    [ -n "$value" ] && echo "env $name $value"
done
if [ -n "${MODULESHOME:-}" ] || [ -n "${LMOD_CMD:-}" ] || command -v modulecmd >/dev/null 2>&1; then
    echo "module yes"
else
    echo "module no"
fi
for tool in apptainer singularity enroot nvidia-smi rocm-smi; do
    p=$(command -v "$tool" 2>/dev/null) && echo "tool $tool $p"
done
for dir in $(echo "${LD_LIBRARY_PATH:-}" | tr ':' ' '); do
    [ -e "$dir/libnccl-net.so" ] && { echo "ofi_nccl $dir/libnccl-net.so"; break; }
done
exit 0
