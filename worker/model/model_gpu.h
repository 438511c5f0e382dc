/* One model replica on a GPU: the CUDA twins of the kernels run the same
 * forward and backward passes as mlp.c and cnn.c, on device copies of the
 * host model's flat buffers (same layout, same offsets). A step uploads the
 * host parameters (where a pull lands) and the batch, and downloads the
 * gradient into the host gradients (what a push sends), so the parameter
 * server side is the same for every device. Built with CUDA only; without
 * it dw_gpu_new returns CM_ENODEV. */
#ifndef DW_MODEL_GPU_H
#define DW_MODEL_GPU_H

#include <stdint.h>

#include "cnn.h"
#include "mlp.h"

/* Device buffers and the kn_cuda context of one replica. */
struct dw_gpu;

/* Device copies for host model mlp or cnn (exactly one non-NULL, borrowed
 * for the replica's life) on CUDA device dev, made current for the calling
 * thread. *out is set on success only. */
int dw_gpu_new(struct dw_gpu **out, int dev, struct dw_mlp *mlp,
               struct dw_cnn *cnn);
void dw_gpu_free(struct dw_gpu *g);

/* As dw_mlp_train_step / dw_cnn_train_step, on the GPU: the loss goes to
 * *loss, the count to *correct (may be NULL); returns 0 or a CM_E* code. */
int dw_gpu_train_step(struct dw_gpu *g, const float *x, const uint8_t *y, int B,
                      float *loss, int *correct);

/* As dw_mlp_evaluate / dw_cnn_evaluate, on the GPU: the number correct goes
 * to *correct and the mean loss to *loss (may be NULL). */
int dw_gpu_evaluate(struct dw_gpu *g, const float *x, const uint8_t *y, int n,
                    int *correct, float *loss);

#endif
