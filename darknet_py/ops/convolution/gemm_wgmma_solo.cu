// The Hopper GEMM of gemm_wgmma.cu with lone blocks (clusters of one, no multicast of B),
// for products of a single 128-row tile row (M <= 128: a layer of 128 filters or fewer, or
// a data gradient over as few channels), where the pair's second block would multiply
// only TMA's zero fill: cuda_wgmma.solo_kernels. The same entry points.
#define WG_CLUSTER 1
#include "gemm_wgmma.cu"
