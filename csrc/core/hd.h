/* GT_HD marks element math shared by the C11 CPU backend and CUDA kernels
 * (DESIGN.md principle 3): __host__ __device__ under nvcc, plain static inline in C. */
#ifndef GT_HD_H
#define GT_HD_H

#if defined(__CUDACC__)
#define GT_HD static inline __host__ __device__
#else
#define GT_HD static inline
#endif

#endif
