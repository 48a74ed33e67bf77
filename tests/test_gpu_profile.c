// test_gpu_profile.c — hwprofile_for_gpu (train/hwprofile.h): which built-in profile a GPU's CUDA device name
// (cudaDeviceProp.name, as the devices report it) selects for TensorBoard's perf/mfu. The names are the ones
// NVIDIA's parts report; the expected profile follows from the part: the H200 and H100 SXM are the parts
// the built-ins describe (989 TFLOP/s bf16 dense), the PCIe and NVL variants run lower clocks and peaks
// (H100 PCIe 756, H200 NVL 835), and the others have no built-in at all, so none of those gets an MFU.
#include <string.h>
#include "train/hwprofile.h"
#include "test_util.h"

static void expect_profile(const char *device, const char *want) {
    const HwProfile *p = hwprofile_for_gpu(device);
    if (want)
        EXPECT(p && !strcmp(p->name, want), "\"%s\": profile %s, want %s", device, p ? p->name : "none",
               want);
    else EXPECT(!p, "\"%s\": profile %s, want none", device, p ? p->name : "none");
}

int main(void) {
    expect_profile("NVIDIA H200", "h200");
    expect_profile("NVIDIA H100 80GB HBM3", "h100");
    expect_profile("nvidia h100 80gb hbm3", "h100"); // case aside
    expect_profile("NVIDIA H100 PCIe", NULL);
    expect_profile("NVIDIA H100 NVL", NULL);
    expect_profile("NVIDIA H200 NVL", NULL);
    expect_profile("NVIDIA GH200 480GB", NULL); // not the word h200
    expect_profile("NVIDIA H20", NULL);
    expect_profile("NVIDIA H800", NULL);
    expect_profile("Tesla V100-SXM2-16GB", NULL);
    expect_profile("NVIDIA A100-SXM4-80GB", NULL);
    expect_profile("NVIDIA GeForce RTX 4090", NULL);
    expect_profile("", NULL); // no GPU name (ops.h backend_cuda_device_name before the backend exists)
    expect_profile(NULL, NULL);
    // the profile's numbers are the built-in's own (the MFU's denominator)
    const HwProfile *p = hwprofile_for_gpu("NVIDIA H200");
    EXPECT(p && p == hwprofile_builtin("h200") && p->peak_tflops == 989, "h200's peak %g",
           p ? p->peak_tflops : -1.0);
    return test_done("test_gpu_profile");
}
