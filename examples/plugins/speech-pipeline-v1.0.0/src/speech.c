/* speech-pipeline: frames audio for the encoder. */
int speech_frames(int samples, int frame) { return frame > 0 ? samples / frame : 0; }
