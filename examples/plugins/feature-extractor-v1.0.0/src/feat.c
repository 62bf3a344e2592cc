/* Band energies of a normalised frame: the native half of the feature-extractor example. */
#include <stddef.h>

int feat_band_energy(const double *frame, int n, int bands, double *out)
{
    if (frame == NULL || out == NULL || n <= 0 || bands <= 0 || bands > n)
        return -1;
    int width = n / bands;
    for (int b = 0; b < bands; b++) {
        double sum = 0.0;
        for (int i = b * width; i < (b + 1) * width; i++)
            sum += frame[i] * frame[i];
        out[b] = sum;
    }
    return bands;
}
