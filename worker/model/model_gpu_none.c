/* The GPU replica of a build without CUDA: there is never a GPU. */
#include "model_gpu.h"

#include "err.h"

int dw_gpu_new(struct dw_gpu **out, int dev, struct dw_mlp *mlp,
               struct dw_cnn *cnn) {
  (void)out, (void)dev, (void)mlp, (void)cnn;
  return CM_ENODEV;
}

void dw_gpu_free(struct dw_gpu *g) { (void)g; }

int dw_gpu_train_step(struct dw_gpu *g, const float *x, const uint8_t *y, int B,
                      float *loss, int *correct) {
  (void)g, (void)x, (void)y, (void)B, (void)loss, (void)correct;
  return CM_ENODEV;
}

int dw_gpu_evaluate(struct dw_gpu *g, const float *x, const uint8_t *y, int n,
                    int *correct, float *loss) {
  (void)g, (void)x, (void)y, (void)n, (void)correct, (void)loss;
  return CM_ENODEV;
}
