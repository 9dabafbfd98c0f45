// A checkpoint file manager for the exactly-once test: it stops the streaming query's
// thread just before the commit log records batch $PAUSE_BEFORE_COMMIT (after the sink
// wrote the batch), writes the file $PAUSE_MARKER and never returns, so the test can kill
// the driver at exactly that point. Everything else is the manager the jobs use on local
// files (streamjob.py): Spark's FileSystem-based one.
import java.nio.file.Files;
import java.nio.file.Paths;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;

public class PauseBeforeCommit extends FileSystemBasedCheckpointFileManager {
    public PauseBeforeCommit(Path path, Configuration conf) {
        super(path, conf);
    }

    @Override
    public CheckpointFileManager.CancellableFSDataOutputStream createAtomic(
            Path path, boolean overwriteIfPossible) {
        String batch = System.getenv("PAUSE_BEFORE_COMMIT");
        if (batch != null && path.getName().equals(batch)
                && path.getParent().getName().equals("commits")) {
            try {
                Files.writeString(Paths.get(System.getenv("PAUSE_MARKER")), path.toString());
            } catch (java.io.IOException error) {
                throw new RuntimeException(error);
            }
            while (true) {  // interrupts too: the commit must never be written
                try {
                    Thread.sleep(60_000);
                } catch (InterruptedException ignored) {
                    // keep waiting for the kill
                }
            }
        }
        return super.createAtomic(path, overwriteIfPossible);
    }
}
