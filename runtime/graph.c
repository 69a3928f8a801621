/* graph.c: in progress */
