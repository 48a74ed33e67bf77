// stages.h — how the model's layers are split into pipeline stages: PP ranks x VPP chunks per rank
// = PP*VPP virtual stages, virtual stage k = chunk * PP + stage (the interleaved order: rank s holds
// chunks s, s+PP, ...). Even split (n_layers divisible by PP*VPP) or a list, one count per virtual
// stage (--pp-layers 5,5,6). The embedding belongs to virtual stage 0, the final norm and the LM
// head to the last.
// Must not hold: the schedule (train/schedule.h), communication, tensors.
#pragma once

#define STAGES_MAX 256

typedef struct {
    int pp, vpp;
    int first[STAGES_MAX + 1]; // virtual stage k holds layers [first[k], first[k+1])
} StageSplit;

// NULL and *s filled, or a static message naming the numbers (layers not divisible without a list,
// a list with another count of entries, a sum other than n_layers, a stage without layers).
// list: NULL or "" for the even split.
const char *stages_split(StageSplit *s, int n_layers, int pp, int vpp, const char *list);
// The virtual stage holding layer l.
int stages_of_layer(const StageSplit *s, int l);
