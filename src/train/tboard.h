// tboard.h — TensorBoard scalar event files, written by our own code (no TensorFlow): each event a TFRecord
// (its length, the length's masked CRC32C, the bytes, their masked CRC32C) holding an Event protobuf encoded
// by hand (wall_time, step, and a Summary of tagged simple_values), so `tensorboard --logdir runs/` shows a
// run's scalars beside its other runs'. Must not hold: which scalars a run logs (trainer.c), reading event
// files.
#pragma once

typedef struct TbWriter TbWriter;

// Creates dir/events.out.tfevents.<seconds>.<host>.<pid>.moe and writes its first events: the file version,
// and a session start at step first_step + 1 (TensorBoard then drops what earlier files of the run logged
// from that step on: a resume does those steps again). max_values: the most scalars one event holds. Dies
// naming the file when it cannot be created or written.
TbWriter *tb_open(const char *dir, long first_step, int max_values);
// Adds one scalar to the event being built (tag: at most TB_TAG_MAX bytes; a non-finite value is skipped).
void tb_add(TbWriter *w, const char *tag, double v);
// Writes the scalars added since the last tb_write as one event at step and flushes it; a failed write cuts
// the file back to its last whole event and dies naming it. Allocates nothing.
void tb_write(TbWriter *w, long step);
void tb_close(TbWriter *w);
#define TB_TAG_MAX 64
