/* exec.c: in progress */
