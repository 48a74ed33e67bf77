// safetensors.h — the safetensors file format: writing F32 tensors (whole files, or a sized skeleton
// whose data others pwrite), reading one tensor at a time by name (F32, BF16 or F16, converted to
// float). Needs a little-endian host (dies otherwise). Must not hold: what the tensors mean
// (parameter tables, checkpoint directories, Hugging Face names): io/checkpoint.c and io/hf.c.
#pragma once
#include <stdint.h>

typedef struct {
    char name[128];
    int ndim;
    int64_t shape[4];
    const float *data;
} StTensor;

// Writes path (F32; tensors in the order given, 8-byte aligned data; metadata_json: a JSON object of
// strings or NULL, "format":"pt" added when it has no "format"). Dies naming the file and tensor on a
// bad name, a duplicate, more than 4 dims or missing data.
void safetensors_write(const char *path, const StTensor *ts, int n, const char *metadata_json);
// The same header, the file sized to hold the data but the data left zero (ts[].data unused); returns
// the byte offset where the data begins (tensors follow in order, 4 bytes per element).
uint64_t safetensors_write_skeleton(const char *path, const StTensor *ts, int n, const char *metadata_json);

// safetensors_open dies naming the file on a malformed header (truncated, not JSON, offsets outside
// the data, byte counts that disagree with dtype and shape); safetensors_read dies naming the file and
// tensor on a missing tensor, a dtype other than F32/BF16/F16, or a shape other than ndim/shape.
typedef struct StFile StFile;
StFile *safetensors_open(const char *path);
void safetensors_close(StFile *f);
int safetensors_count(const StFile *f); // tensors (the __metadata__ entry excluded)
const char *safetensors_name(const StFile *f, int i); // i-th tensor in header order (NULL past the end)
void safetensors_read(const StFile *f, const char *name, int ndim, const int64_t *shape, float *dst);
