/* dsp-kernels: a windowing helper; the version string is what the tests look for. */
const char *dsp_version(void) { return DSP_VERSION; }

void dsp_hann(float *x, int n)
{
    for (int i = 0; i < n; i++)
        x[i] *= 0.5f - 0.5f * (float)__builtin_cos(6.283185307179586 * i / (n - 1));
}
