// Apache Hadoop's MiniDFSCluster (from Maven Central's hadoop-client-minicluster) as a
// standalone baseline for the WebHDFS benchmark: one NameNode and N DataNodes in this JVM, data
// under DIR, WebHDFS on 127.0.0.1:PORT, permissions off (as upright-hdfs). With `sync`, each
// DataNode syncs a block's file to disk when it is closed (dfs.datanode.synconclose, off by
// default in HDFS; upright's DataNodes always sync). Runs until killed.
// Usage: java -cp 'JARS/*' scripts/hadoop/MiniHdfs.java PORT DIR [DATANODES] [sync]
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

public class MiniHdfs {
    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: MiniHdfs PORT DIR [DATANODES] [sync]");
            System.exit(2);
        }
        int port = Integer.parseInt(args[0]);
        int datanodes = args.length > 2 ? Integer.parseInt(args[2]) : 3;
        Configuration conf = new Configuration();
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, args[1]);
        conf.setBoolean("dfs.webhdfs.enabled", true);
        conf.setBoolean("dfs.permissions.enabled", false);
        conf.set("dfs.datanode.hostname", "127.0.0.1");
        boolean sync = args.length > 3 && args[3].equals("sync");
        conf.setBoolean("dfs.datanode.synconclose", sync);
        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
            .numDataNodes(datanodes)
            .nameNodeHttpPort(port)
            .build();
        cluster.waitActive();
        System.out.println("MiniDFSCluster ready: WebHDFS on http://127.0.0.1:" + port + " with " + datanodes + " DataNodes" + (sync ? ", synconclose" : ""));
        System.out.flush();
        Thread.sleep(Long.MAX_VALUE);
    }
}
