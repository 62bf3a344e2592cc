/* Calls one function from a newer glibc and one from a newer libstdc++ (both provided at
 * build time only by the stubs in ../stubs, which are not shipped with the plugin). */
int seedance_future_libc_call(void);
int seedance_future_cxx_call(void);

int future_entry(void) { return seedance_future_libc_call() + seedance_future_cxx_call(); }
