// pipe.h — the moves between pipeline stages around the model: one action of a schedule (the forward
// or the backward of one micro-batch on one of this rank's chunks) with the receive of its input from
// the neighbouring virtual stage and the send of its output. Forward: the residual stream (N,d) and
// the router statistics carried along (aux, z, dropped, HF's per-expert sums), to virtual stage k+1;
// backward: the gradient of the chunk's input (N,d) and, for the HF aux form, the final per-expert
// fractions, to k-1. Sends are non-blocking; receives wait, and that wait is the stage's idle time (the
// bubble). A forward's output leaves from its slot (whose next use comes after the micro-batch's
// backward, so after the receiver took it); a backward's gradient leaves from a pool of send buffers
// (its slot may be taken by the next forward before the previous stage receives it: waiting there
// deadlocks the interleaved schedule). Without stages an action is the model's alone.
// Must not hold: the order of the actions (train/schedule.c), the optimizer step (train/step.c).
#pragma once
#include "model/model.h"
#include "parallel/comm.h"

typedef struct {
    Model *m;
    const Comm *pp; // the pipeline group (rank = stage); NULL: one stage
    int stages, stage, vpp;
    int ncarry; // doubles carried forward: aux, z, dropped, hf_fe[E], hf_pe[E]
    double *carry; // (chunk-slots, ncarry) the forward's outgoing carry
    CommReq **sreq; // (chunk-slots, 3) the forward's sends in flight from each chunk's slot (the third:
                    // MTP's embedding rows, model.h)
    int soff[MODEL_MAX_CHUNKS + 1]; // chunk c's slots are [soff[c], soff[c+1]) of those
    struct PipeSendBuf *pool; // the backward's send buffers (grown while all are in flight)
    int npool;
    double idle_s; // time spent waiting for receives since the last pipe_flush
} Pipe;

// stages = the pp group's size (vpp chunks per rank, as the model's split); slots = the model's
// (set them before pipe_init).
void pipe_init(Pipe *p, Model *m, const Comm *pp, int vpp);
void pipe_free(Pipe *p);
// Is chunk c of this rank the model's first / last virtual stage?
int pipe_first(const Pipe *p, int chunk);
int pipe_last(const Pipe *p, int chunk);
// The forward of a micro-batch (tokens x, targets y: host, (B,T)) on chunk, in slot. Returns the
// model's result (the mean loss of this rank's tokens on the last virtual stage, else 0); m->aux, z,
// dropped are then the carried sums of the layers so far (complete on the last virtual stage).
double pipe_forward(Pipe *p, int chunk, int slot, const int32_t *x, const int32_t *y, int B, int T,
                    float dloss, uint64_t noise_seed);
// The backward of the forward held in slot (on chunk).
void pipe_backward(Pipe *p, int chunk, int slot, float aux_scale, float z_scale);
// Waits for every send in flight.
void pipe_flush(Pipe *p);

// Forward only (evaluation, sampling): one micro-batch through every chunk of every stage, in slot 0.
void pipe_forward_all(Pipe *p, const int32_t *x, const int32_t *y, int B, int T);
// After it, on every rank: the per-token losses (N floats, host) / the logits row at (b, t) (V floats),
// from the last stage.
void pipe_losses(Pipe *p, float *out, int N);
void pipe_logits_row(Pipe *p, int b, int t, float *out);
