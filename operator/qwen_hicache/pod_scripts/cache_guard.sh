set -eu
root="$QWEN_HICACHE_CACHE_ROOT"; fp="$QWEN_HICACHE_FINGERPRINT"; keep="$QWEN_HICACHE_KEEP_OLD"
dir="$root/$fp"; marker="$dir/.qwen-hicache-fingerprint"
mkdir -p "$dir"
if [ -e "$marker" ]; then
  have="$(cat "$marker")"
  if [ "$have" != "$fp" ]; then
    echo "refusing cache directory $dir: its marker names configuration $have, this pod is $fp" >&2
    exit 3
  fi
else
  printf '%s\n' "$fp" > "$marker.tmp" && mv "$marker.tmp" "$marker"
fi
touch "$marker"
n=0
for m in $(ls -1t "$root"/*/.qwen-hicache-fingerprint 2>/dev/null); do
  d="${m%/.qwen-hicache-fingerprint}"
  [ "$d" = "$dir" ] && continue
  n=$((n + 1))
  if [ "$n" -gt "$keep" ]; then echo "removing old cache namespace $d"; rm -rf "$d"; else echo "keeping $d"; fi
done
for j in "$root"/.jit/*; do
  [ -d "$j" ] || continue
  [ -d "$root/${j##*/}" ] && continue
  echo "removing compiled kernels of removed namespace ${j##*/}"; rm -rf "$j"
done
echo "cache namespace $dir ready"
