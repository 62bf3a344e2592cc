/* Build-time stand-in for a glibc newer than any real one (version node GLIBC_2.99). */
int seedance_future_libc_call(void) { return 1; }
