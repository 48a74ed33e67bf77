// rng.h — deterministic random numbers (splitmix64 seeding + xoshiro256**), identical on every platform.
#pragma once
#include <stdint.h>

typedef struct {
    uint64_t s[4];
} Rng;

void rng_seed(Rng *r, uint64_t seed);
uint64_t rng_u64(Rng *r);
uint32_t rng_below(Rng *r, uint32_t n); // uniform in [0, n)
float rng_uniform(Rng *r); // uniform in [0, 1)
float rng_normal(Rng *r); // standard normal (Box-Muller)
